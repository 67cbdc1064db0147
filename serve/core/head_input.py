"""The lm_head's input in standard strides.

transformers computes the logits of a prefill as `lm_head(hidden_states[:, -1:, :])` (`logits_to_keep=1`): a
(B, 1, h) slice of a (B, T, h) tensor, whose batch stride is T x h. torch's CPU matmul (2.13) does not fold such a
slice into one matrix product: it runs a batched one over the weight expanded per row and made contiguous, a copy of
the whole (V, h) weight for every row. On the default target in bf16 (one thread) that took 114 ms for one row and
7.0 s for 64, against 8 and 24 ms on a copy of the slice: a third of self-distillation's prefill time, and 0.1 s of
every prompt's prefill in decoding. The copy here is (B, h), once per forward.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn


def _standard(module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
    x = args[0] if args else None
    if not isinstance(x, torch.Tensor) or x.dim() < 3:
        return None
    if x.stride() == _strides(x.shape):
        return None
    return (x.clone(memory_format=torch.contiguous_format), *args[1:])


def _strides(shape: torch.Size) -> tuple[int, ...]:
    """The strides of a freshly allocated tensor of `shape`."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


def standard_head_input(model: nn.Module) -> None:
    """Give `model`'s output embeddings (its lm_head) inputs in standard strides (a copy where they are not)."""
    head = model.get_output_embeddings()
    if head is not None and not getattr(head, "_draftsmith_standard_input", False):
        head.register_forward_pre_hook(_standard)
        head._draftsmith_standard_input = True
