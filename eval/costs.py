"""Measuring the costs the cost model needs, on the target itself, in the same run as the timings.

A target forward over n new tokens on a cached context of `context_tokens` tokens, for each n, the
n's interleaved across repeats so a noisy machine hits them alike (draftsmith.serve.core.costs.forward_times, the same
measurement the draft-length policy starts from). The cost model uses the fastest repeat of each (the least
disturbed by other work; timeit's advice), the median is kept for the record.
"""
from __future__ import annotations

import statistics
from typing import Sequence

import torch

from draftsmith.serve.core.costs import forward_times
from draftsmith.serve.core.invariant import (LOW_PRECISION, is_invariant, make_invariant, make_variant,
                                             unsupported_reason)

__all__ = ["context_ids", "fastest", "forward_times", "invariance_costs", "median"]


def context_ids(prompt_ids: Sequence[Sequence[int]], context_tokens: int) -> torch.Tensor:
    """(1, context_tokens) long: the evaluation prompts concatenated (and repeated) to the wanted length."""
    flat = [t for ids in prompt_ids for t in ids]
    if not flat:
        raise ValueError("no prompt tokens to build a timing context from")
    while len(flat) < context_tokens:
        flat = flat + flat
    return torch.tensor([flat[:context_tokens]], dtype=torch.long)  # (1, T)


def fastest(times: dict[int, list[float]]) -> dict[int, float]:
    return {n: min(ts) for n, ts in times.items()}


def median(times: dict[int, list[float]]) -> dict[int, float]:
    return {n: statistics.median(ts) for n, ts in times.items()}


def invariance_costs(model, context: torch.Tensor, ns: Sequence[int], *, repeats: int) -> dict | None:
    """What batch-invariant forwards cost (serve/core/invariant.py): forwards over each n in `ns` new tokens with the
    invariant kernels and with the ordinary ones, alternating round by round, the fastest of each -> {invariant:
    {n: s}, ordinary: {n: s}, slowdown: {n: invariant / ordinary}}. None for a float32 target that is not
    invariant (nothing to compare) or one that cannot be made invariant. The model is left as it came."""
    was = is_invariant(model)
    if not was and (next(model.parameters()).dtype not in LOW_PRECISION or unsupported_reason(model) is not None):
        return None
    times: dict[str, dict[int, list[float]]] = {"invariant": {n: [] for n in ns}, "ordinary": {n: [] for n in ns}}
    try:
        for _ in range(repeats):
            for mode, switch in (("invariant", make_invariant), ("ordinary", make_variant)):
                switch(model)
                for n, ts in forward_times(model, context, ns, repeats=1).items():
                    times[mode][n] += ts
    finally:
        (make_invariant if was else make_variant)(model)
    best = {mode: fastest(t) for mode, t in times.items()}
    return {**best, "slowdown": {n: best["invariant"][n] / best["ordinary"][n] for n in ns}}
