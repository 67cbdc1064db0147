"""Custom 4-D attention masks for a target's forward, in the form its attention implementation reads.

transformers passes a prepared 4-D mask to the attention function as it is. SDPA reads a boolean mask (True = may
attend); eager attention (gpt-oss: SDPA has no attention sinks) ADDS the mask to its scores, so a boolean one would
let every query see every key. Masks built as booleans go through `for_target` before the forward.
"""
from __future__ import annotations

from typing import Any

import torch

Masks = torch.Tensor | dict[str, torch.Tensor]  # one mask, or one per layer type (sliding / full attention)


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """bool mask (True = may attend) -> additive float mask of the same shape (0 / the dtype's most negative)."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(~allowed,
                                                                                      torch.finfo(dtype).min)


def for_target(model: Any, masks: Masks) -> Masks:
    """(B, 1, Q, K) bool masks, or a dict of them -> what the model's attention reads (bool, or 0 / dtype min)."""
    if isinstance(masks, dict):
        return {kind: for_target(model, mask) for kind, mask in masks.items()}
    if getattr(model.config, "_attn_implementation", "sdpa") != "eager":
        return masks
    return additive_mask(masks, model.dtype)
