"""Measuring the costs the cost model needs, on the target itself, in the same run as the timings.

A target forward over n new tokens on a cached context of `context_tokens` tokens, for each n, the
n's interleaved across repeats so a noisy machine hits them alike. The cost model uses the fastest
repeat of each (the least disturbed by other work; timeit's advice), the median is kept for the record.
"""
from __future__ import annotations

import statistics
import time
from typing import Sequence

import torch

from serve.kv import cache_kwargs, new_cache, rollback


def context_ids(prompt_ids: Sequence[Sequence[int]], context_tokens: int) -> torch.Tensor:
    """(1, context_tokens) long: the evaluation prompts concatenated (and repeated) to the wanted length."""
    flat = [t for ids in prompt_ids for t in ids]
    if not flat:
        raise ValueError("no prompt tokens to build a timing context from")
    while len(flat) < context_tokens:
        flat = flat + flat
    return torch.tensor([flat[:context_tokens]], dtype=torch.long)  # (1, T)


@torch.inference_mode()
def forward_times(model, context: torch.Tensor, ns: Sequence[int], *, repeats: int = 5) -> dict[int, list[float]]:
    """Seconds of each repeat of a forward over n new tokens after `context` (KV-cached), for each n in `ns`."""
    device = next(model.parameters()).device
    context = context.to(device)  # (1, T)
    length = context.shape[1]
    cache = new_cache(model)
    model(input_ids=context, logits_to_keep=1, **cache_kwargs(model, cache))
    times: dict[int, list[float]] = {n: [] for n in ns}
    for r in range(repeats + 1):  # round 0 warms every shape up and is discarded
        for n in ns:
            new_ids = context[:, :n]  # (1, n): real tokens, the content does not change the cost
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            model(input_ids=new_ids, **cache_kwargs(model, cache))  # all n logits, as a verify forward
            if device.type == "cuda":
                torch.cuda.synchronize()
            elapsed = time.perf_counter() - start
            rollback(cache, length)
            if r > 0:
                times[n].append(elapsed)
    return times


def fastest(times: dict[int, list[float]]) -> dict[int, float]:
    return {n: min(ts) for n, ts in times.items()}


def median(times: dict[int, list[float]]) -> dict[int, float]:
    return {n: statistics.median(ts) for n, ts in times.items()}
