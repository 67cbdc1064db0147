"""Rows forwarded together, grouped by length: each group right- or left-padded to its longest row, so a group's
padded size (rows x longest) stays within a token budget. Capture (data/capture.py) forwards its rows this way, and
the batched decoder prefills the newcomers it admits together this way, so a short prompt is not padded to a long
one's length. (It did not speed a build up measurably: a third of the newcomers' prefill time was the lm_head's
copy of its weight, serve/core/head_input.py, and most newcomers arrive one at a time.)
"""
from __future__ import annotations

PREFILL_TOKENS = 4096  # padded tokens per prefill forward: large enough that the matmuls run at full speed


def plan_batches(lengths: list[int], batch_tokens: int) -> list[list[int]]:
    """Indices grouped so that each batch's padded size (rows x longest) stays within batch_tokens
    (a longer single row gets a batch of its own). Longest rows first, so padding stays small."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    for i in order:
        if batches and (len(batches[-1]) + 1) * lengths[batches[-1][0]] <= batch_tokens:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches
