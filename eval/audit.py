"""The exactness audit: every greedy output that differs from plain decoding, explained or called a bug.

Speculative decoding at temperature 0 must reproduce plain decoding token for token. Where it does not, the cause
is either the precision (a verify forward and a one-token step rounded the same logits apart, and two tokens whose
logits were all but tied swapped places) or a bug. The audit tells them apart at the first differing position:
on the shared prefix it recomputes the logits of the two candidate tokens in a higher precision (float32 for a
16-bit target, float64 for a float32 one) and in the target's own precision, the position computed as the last of
1 to 8 new tokens on a cache (plain decoding's step, a verify forward's shapes) and in one forward over the whole
prefix (a prefill's).

- gap: how far apart the two tokens' logits are in the higher precision;
- rounding: what the target's precision can move them by there, the larger of one unit in the last place at
  their magnitude and the largest sum of the two tokens' errors over those forwards.

A divergence whose gap is within its rounding is a rounding flip: the precision cannot tell the two tokens apart,
and either path's choice is the target's. Anything else, or an output that stopped at another length, is
unexplained: a bug in the decoder, the drafter's bookkeeping or the cache.

Sampled runs are seeded, and a seeded run picks the token with the most logit / temperature + Gumbel noise, the
noise keyed by the seed and the output position (serve/core/noise.py): the gap is then the two tokens' perturbed
scores' distance, the rounding the logits' divided by the temperature. A token top-k or top-p filters out in the
higher precision has no score there: unexplained.
"""
from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Sequence

import torch

from draftsmith.serve.core.invariant import make_variant
from draftsmith.serve.core.kv import cache_kwargs, new_cache, record_states
from draftsmith.serve.core.noise import gumbel
from draftsmith.serve.core.sampling import process_logits
from draftsmith.serve.core.target import Target

ROUNDING_FLIP = "rounding flip"
# the forwards the target's own logits are measured on: the position computed as the last of 1 (plain decoding's
# step), 2, 4, 6 or 8 new tokens on a cache (verify forwards' shapes), and in one forward over the whole prefix
PATHS = (1, 2, 4, 6, 8, None)
UNEXPLAINED = "unexplained"


@dataclass(frozen=True)
class Divergence:
    id: str
    drafter: str
    position: int  # index of the first differing output token
    plain_token: int | None  # None: plain decoding's output ended there
    drafter_token: int | None
    gap: float | None  # |logit(plain) - logit(drafter)| in the higher precision on the shared prefix (sampled: of
    # the perturbed scores logit / temperature + noise)
    rounding: float | None  # what the target's precision can move the two logits by there
    kind: str  # ROUNDING_FLIP | UNEXPLAINED


def ulp(dtype: torch.dtype, magnitude: float) -> float:
    """One unit in the last place of `dtype` at `magnitude` (bfloat16 at 10.0: 0.0625)."""
    exponent = math.floor(math.log2(abs(magnitude))) if magnitude else 0
    return torch.finfo(dtype).eps * 2.0 ** exponent


def classify(gap: float | None, rounding: float | None) -> str:
    return ROUNDING_FLIP if gap is not None and rounding is not None and gap <= rounding else UNEXPLAINED


def reference_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float32 else torch.float32


class Auditor:
    """The logits the audit compares, for one target. The higher-precision copy of the target is made on the first
    divergence and kept for the rest of the run."""

    def __init__(self, target: Target, sampling: Mapping[str, Any] | None = None):
        self.sampling = sampling  # temperature, top_k, top_p of a sampled (seeded) run; None: greedy
        self.model = target.model
        self.dtype = next(self.model.parameters()).dtype
        self._reference = None

    @property
    def reference(self):
        if self._reference is None:
            model = copy.deepcopy(self.model)
            make_variant(model)  # the ordinary kernels: the reference decides nothing but the two logits' gap
            self._reference = model.to(reference_dtype(self.dtype))
        return self._reference

    @torch.inference_mode()
    def _logits(self, model, prefix: torch.Tensor, *, new: int | None) -> torch.Tensor:
        """(V,) float64 logits after `prefix` (1, T): from one forward over all of it (new=None), or from a forward
        over its last `new` tokens on the cached rest (1: plain decoding's step; more: a verify forward's shape)."""
        device = next(model.parameters()).device
        prefix = prefix.to(device)
        if new is None or prefix.shape[1] <= new:
            return model(prefix, logits_to_keep=1).logits[0, -1].double().cpu()
        cache = new_cache(model)
        model(prefix[:, :-new], logits_to_keep=1, **cache_kwargs(model, cache))
        record_states(cache, new)  # a hybrid target's verify forward records the states it may roll back to
        return model(prefix[:, -new:], **cache_kwargs(model, cache)).logits[0, -1].double().cpu()

    def _sampled_gap(self, exact: torch.Tensor, a: int, b: int, seed: int, position: int) -> float | None:
        """|score(a) - score(b)| of a seeded run at output `position`: score = processed logit + the position's
        Gumbel noise (serve/core/noise.py), from the higher-precision logits; None when either is filtered out."""
        scores = process_logits(exact, **self.sampling).double() + gumbel(seed, position, exact.shape[-1])
        if not (math.isfinite(float(scores[a])) and math.isfinite(float(scores[b]))):
            return None
        return abs(float(scores[a] - scores[b]))

    def divergence(self, reference: Mapping[str, Any], candidate: Mapping[str, Any], position: int) -> Divergence:
        """position: the first differing output token; -1 when the outputs agree but a method's repeated runs did
        not (a decoder that does not repeat itself at temperature 0: unexplained)."""
        plain, drafted = list(reference["output_token_ids"]), list(candidate["output_token_ids"])
        a = plain[position] if 0 <= position < len(plain) else None
        b = drafted[position] if 0 <= position < len(drafted) else None
        gap = rounding = None
        if a is not None and b is not None:
            prefix = torch.tensor([list(reference["prompt_token_ids"]) + plain[:position]])  # (1, T)
            exact = self._logits(self.reference, prefix, new=None)
            gap = abs(float(exact[a] - exact[b]))
            errors = [(self._logits(self.model, prefix, new=new) - exact)[[a, b]].abs() for new in PATHS]
            measured = max(float(e.sum()) for e in errors)
            rounding = max(ulp(self.dtype, max(abs(float(exact[a])), abs(float(exact[b])))), measured)
            if self.sampling:
                gap, rounding = self._sampled_gap(exact, a, b, int(candidate["seed"]), position), \
                    rounding / self.sampling["temperature"]
        return Divergence(id=str(candidate.get("id", "")), drafter=str(candidate.get("drafter", "")),
                          position=position, plain_token=a, drafter_token=b, gap=gap, rounding=rounding,
                          kind=classify(gap, rounding))


def audit(target: Target, records: Mapping[str, Sequence[Mapping[str, Any]]], names: Sequence[str], *,
          baseline: str, sampling: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Every record of `names` whose output differs from `baseline`'s (records carry `first_mismatch`, set by
    eval.runner.mark_exactness) -> {rounding_flips, unexplained, by_drafter: {name: {...}}, divergences: [...]}.
    sampling: the runs' temperature, top_k and top_p when they sampled (seeded: the records carry `seed`)."""
    auditor = Auditor(target, sampling)
    found: list[Divergence] = []
    for name in names:
        for ref, rec in zip(records[baseline], records[name]):
            if rec.get("first_mismatch") is not None:
                found.append(auditor.divergence(ref, rec, int(rec["first_mismatch"])))
            elif ref.get("repeats_differ") or rec.get("repeats_differ"):
                found.append(auditor.divergence(ref, rec, -1))
    by = {name: {ROUNDING_FLIP: sum(d.kind == ROUNDING_FLIP for d in found if d.drafter == name),
                 UNEXPLAINED: sum(d.kind == UNEXPLAINED for d in found if d.drafter == name)} for name in names}
    return {"rounding_flips": sum(d.kind == ROUNDING_FLIP for d in found),
            "unexplained": sum(d.kind == UNEXPLAINED for d in found),
            "dtype": str(auditor.dtype).replace("torch.", ""),
            "reference_dtype": str(reference_dtype(auditor.dtype)).replace("torch.", ""),
            "by_drafter": by, "divergences": [asdict(d) for d in found]}
