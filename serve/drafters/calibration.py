"""What the length policy believes a draft's acceptance is: P(accepted | key) learned from the drafter's own verified
drafts (a Beta-binomial per key, the drafter's signal as its prior), and the odds scaling by which the current
generation's drafts correct the estimates pooled over every generation (serve/drafters/length.py uses both)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Hashable


@dataclass
class Calibration:
    """P(accepted | key): Beta-binomial per key with the drafter's prior as pseudo-counts, learned from the
    drafter's own verified drafts. Old evidence decays, so the estimate follows the current text."""
    # the prior is worth 3 drafts: a key's own evidence outweighs it from its fourth verified draft, whatever the
    # text (a weak prior, there to keep one early accept or reject from reading as certainty)
    prior_weight: float = 3.0
    # per observation of the same key: evidence ~200 drafts old weighs 1/e, so a long-running server follows a drift
    # in its traffic while any one key still pools hundreds of drafts (an estimate of p to about ±0.05)
    decay: float = 0.995
    counts: dict = field(default_factory=dict)  # key -> [accepted, tried]

    def predict(self, key: Hashable, prior: float) -> float:
        accepted, tried = self.counts.get(key, (0.0, 0.0))
        return (accepted + self.prior_weight * prior) / (tried + self.prior_weight)

    def update(self, key: Hashable, accepted: bool) -> None:
        entry = self.counts.setdefault(key, [0.0, 0.0])
        entry[0] = entry[0] * self.decay + float(accepted)
        entry[1] = entry[1] * self.decay + 1.0


def scale_odds(p: float, factor: float) -> float:
    """p with its odds multiplied by `factor` (> 0): stays inside (0, 1) for any factor."""
    if p <= 0.0 or p >= 1.0:
        return p
    odds = p / (1.0 - p) * factor
    return odds / (1.0 + odds)


def generation_factor(accepted: float, expected: float, tried: float, weight: float) -> float:
    """The odds ratio by which the current generation's drafts beat the pooled estimates: of `tried` drafts,
    `accepted` were accepted where the estimates summed to `expected`. Accepted over expected, divided by rejected
    over expected rejections, each with `weight` pseudo-drafts at the pooled rate: 1 before any draft, and a few
    drafts move it."""
    return ((accepted + weight) / (expected + weight)) / ((tried - accepted + weight) / (tried - expected + weight))
