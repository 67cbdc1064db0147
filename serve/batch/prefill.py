"""Rows forwarded together, grouped by length: each group right- or left-padded to its longest row, so a group's
padded size (rows x longest) stays within a token budget. Capture (data/capture.py) forwards its rows this way, and
the batched decoder prefills its newcomers this way: 64 prompts of 30-400 tokens padded to the longest as one
forward spent more than a third of a self-distillation build (265 tokens/s against the probe's 462).
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
