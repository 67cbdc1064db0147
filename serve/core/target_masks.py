"""Custom 4-D attention masks for a target's forward: per attention type (one place for the sliding window, whatever
cache the decoder keeps), in the form its attention implementation reads.

transformers passes a prepared 4-D mask to the attention function as it is. SDPA reads a boolean mask (True = may
attend); eager attention (gpt-oss: SDPA has no attention sinks) ADDS the mask to its scores, so a boolean one would
let every query see every key. Masks built as booleans go through `for_target` before the forward.
"""
from __future__ import annotations

from typing import Any

import torch

Masks = torch.Tensor | dict[str, torch.Tensor | None]  # one mask, or one per layer type (None: the layer takes none)
# layer types whose layers take no attention mask: a recurrent / convolution state instead of attention, or an MLP
# alone (hybrid targets; Falcon-H1's `hybrid` layers read theirs under full_attention)
UNMASKED_LAYER_TYPES = frozenset({"linear_attention", "mamba", "conv", "hybrid", "mlp", "moe"})
# layer types that attend as full attention does, under a mask of their own name: DeepSeek-V3.2's layers (its lightning
# indexer keeps the top keys among those the mask allows)
FULL_LAYER_TYPES = frozenset({"indexed_attention"})


def window_masks(allowed: torch.Tensor, query_positions: torch.Tensor, key_positions: torch.Tensor, *,
                 window: int | None, all_sliding: bool, sliding_from: int = 0) -> Masks:
    """The masks a forward takes, from one (B, 1, Q, K) bool mask over every key the full-attention layers hold.

    A sliding-window layer also drops keys `window` or more positions behind the query (positions broadcast against
    `allowed`; a prepared 4-D mask is used as is by transformers, so the window is applied here). No window: the mask
    itself; every layer sliding (Mistral, Phi-3): the sliding mask alone; mixed layers (Gemma 2/3, Qwen with
    use_sliding_window): one per layer type. sliding_from: the first key column a sliding layer's cache still holds
    (a DynamicCache keeps its last window - 1 positions; the batched decoder's slot cache keeps them all, 0)."""
    if window is None:
        return allowed
    sliding = (allowed & (key_positions > query_positions - window))[..., sliding_from:]
    if all_sliding:
        return sliding
    return {"full_attention": allowed, "sliding_attention": sliding}


def config_masks(config: Any, allowed: torch.Tensor, query_positions: torch.Tensor,
                 key_positions: torch.Tensor) -> Masks:
    """window_masks for a model whose cache holds every position (the slot cache), from its text config: layer_types
    name the sliding layers (Gemma 2/3, Qwen), else config.sliding_window applies to every layer (Mistral, Phi-3)."""
    from draftsmith.serve.core.target_config import text_config

    config = text_config(config)
    layer_types = getattr(config, "layer_types", None)
    unmasked = set(layer_types or ()) & UNMASKED_LAYER_TYPES
    full = set(layer_types or ()) & FULL_LAYER_TYPES
    unknown = set(layer_types or ()) - {"full_attention", "sliding_attention"} - unmasked - full
    if unknown:
        raise NotImplementedError(f"attention layer types {sorted(unknown)} are not supported by batched decoding")
    masks = window_masks(allowed, query_positions, key_positions, window=getattr(config, "sliding_window", None),
                         all_sliding=layer_types is None)
    if full:  # a model reads its mapping by layer type
        masks = dict(masks) if isinstance(masks, dict) else {"full_attention": masks}
        masks.update(dict.fromkeys(full, masks["full_attention"]))
    if not unmasked:
        return masks
    # a hybrid target: its recurrent layers take no mask (the slot cache keeps each row's state at its own last
    # token, so padding after it never counts); a model reads its mapping by layer type (Falcon-H1's mamba part by
    # `linear_attention`, its attention by `full_attention`)
    masks = dict(masks) if isinstance(masks, dict) else {"full_attention": masks}
    return {**masks, **dict.fromkeys(unmasked | {"linear_attention"}), "full_attention": masks["full_attention"]}


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """bool mask (True = may attend) -> additive float mask of the same shape (0 / the dtype's most negative)."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(~allowed,
                                                                                      torch.finfo(dtype).min)


def for_target(model: Any, masks: Masks) -> Masks:
    """(B, 1, Q, K) bool masks, or a dict of them -> what the model's attention reads (bool, or 0 / dtype min)."""
    if isinstance(masks, dict):
        return {kind: None if mask is None else for_target(model, mask) for kind, mask in masks.items()}
    if getattr(model.config, "_attn_implementation", "sdpa") != "eager":
        return masks
    return additive_mask(masks, model.dtype)
