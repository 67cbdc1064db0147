"""What each way of drafting a hybrid's cycle would have yielded on this request: tokens and cost, side by side.

A hybrid (serve/methods/hybrid/drafter.py) can draft a cycle in three ways, its arms: the n-gram chain alone (`ngram`),
the head's draft alone (`head`), or a tree holding both (`tree`, greedy only). Once a cycle's tokens are known, the
tokens each arm would have produced are known too, whichever arm was verified: a draft produces one token more than
the depth of its longest root path that equals the produced tokens (a lower bound when that path ran through all of
them). Their costs, in target steps, are the verify forward over each arm's nodes (measured on the target,
serve/core/costs.py) plus the head's work where the arm includes the head (timed as it ran). So every cycle in which
both parts proposed scores all arms on the same text, and the ratio of their sums is each arm's rate on this request.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

ARMS = ("ngram", "head", "tree")


def accepted_depth(tokens: Sequence[int], parents: Sequence[int] | None, produced: Sequence[int]) -> int:
    """The depth of the longest root path of a draft (a chain when `parents` is None) whose tokens equal `produced`,
    in order: how many of its drafts greedy verification would have accepted."""
    if parents is None:
        parents = range(-1, len(tokens) - 1)
    depth = {-1: 0}
    best = 0
    for node, (token, parent) in enumerate(zip(tokens, parents)):
        d = depth.get(parent)
        if d is None or d >= len(produced) or int(token) != int(produced[d]):
            continue  # off the produced path
        depth[node] = d + 1
        best = max(best, d + 1)
    return best


@dataclass
class ArmLedger:
    """Per arm, the tokens produced and target steps spent over the cycles it was scored on (one request); `verify`:
    the steps of its verify forwards alone, for the choice made once the head's work is spent."""
    tokens: dict[str, float] = field(default_factory=lambda: dict.fromkeys(ARMS, 0.0))
    cost: dict[str, float] = field(default_factory=lambda: dict.fromkeys(ARMS, 0.0))
    verify: dict[str, float] = field(default_factory=lambda: dict.fromkeys(ARMS, 0.0))
    cycles: int = 0  # cycles that scored every arm

    def add(self, scored: dict[str, tuple[float, float, float]]) -> None:
        """scored: arm -> (tokens, cost, verify cost) of one cycle."""
        for arm, (tokens, cost, verify) in scored.items():
            self.tokens[arm] += tokens
            self.cost[arm] += cost
            self.verify[arm] += verify
        self.cycles += 1

    def rate(self, arm: str, *, sunk: bool = False) -> float:
        """Tokens per target step of `arm` on the scored cycles (0 before any); sunk: the head's work left out."""
        cost = (self.verify if sunk else self.cost)[arm]
        return self.tokens[arm] / cost if cost > 0 else 0.0

    def best(self, arms: Iterable[str], *, sunk: bool = False) -> str | None:
        """The arm with the highest rate on this request so far; None before any cycle scored them (neutral). sunk:
        the head has drafted this cycle, so its work is spent whichever arm is verified: compare verify costs."""
        arms = list(arms)
        if not self.cycles:
            return None
        return max(arms, key=lambda arm: (self.rate(arm, sunk=sunk), -arms.index(arm)))

    def clear(self) -> None:
        for table in (self.tokens, self.cost, self.verify):
            for arm in table:
                table[arm] = 0.0
        self.cycles = 0
