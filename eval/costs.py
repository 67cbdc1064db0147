"""Measuring the costs the cost model needs, on the target itself, in the same run as the timings.

A target forward over n new tokens on a cached context of `context_tokens` tokens, for each n, the
n's interleaved across repeats so a noisy machine hits them alike (serve.core.costs.forward_times, the same
measurement the draft-length policy starts from). The cost model uses the fastest repeat of each (the least
disturbed by other work; timeit's advice), the median is kept for the record.
"""
from __future__ import annotations

import statistics
from typing import Sequence

import torch

from serve.core.costs import forward_times

__all__ = ["context_ids", "fastest", "forward_times", "median"]


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
