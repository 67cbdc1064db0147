"""KV-cache handling for verification: creating the cache, rolling back rejected positions, keeping a tree path.

Sliding-window layers (Gemma 2/3, Mistral variants) keep only their last window; they are created with past
recording on so that rejected positions can still be rolled back once the window is full.

Recurrent layers (the linear-attention, Mamba and convolution layers of hybrid targets: Qwen3.5, Qwen3-Next,
Nemotron-H, Granite-4 hybrid, Falcon-H1, LFM2, OLMo-hybrid) carry a state instead of keys and values, so a rejected
draft cannot be cut off their end. transformers' cache layers for them record the state after each token of a
forward when asked (`activate_past_recording`, `recurrent_states_to_keep`) and `crop` returns to one of them: the
decoder asks for the verify forward's tokens (`record_states`) and rolls back as for attention. A tree cannot be
kept on them (its branches share one state), so trees fall back to chains there (`rolls_back_trees`).
"""
from __future__ import annotations

import functools
import inspect

import torch
from transformers import DynamicCache

from draftsmith.serve.core.errors import TargetError


def is_recurrent(layer) -> bool:
    """A cache layer holding a recurrent or convolution state (transformers' linear-attention cache layers)."""
    return hasattr(layer, "conv_states") and hasattr(layer, "cumulative_length_linear")


def _holds_nothing(layer) -> bool:
    """transformers' DummyLayer: an MLP / MoE-only layer, or one that reads another layer's cache."""
    return type(layer).__name__ == "DummyLayer"


def records_recurrent_states() -> bool:
    """Whether the installed transformers can record a recurrent layer's state after each token of a forward
    (`activate_past_recording(recurrent_states_to_keep=...)`, transformers 5.25), which rolling one back needs."""
    from transformers import cache_utils

    mixin = getattr(cache_utils, "LinearAttentionCacheLayerMixin", None)
    return (mixin is not None
            and "recurrent_states_to_keep" in inspect.signature(mixin.activate_past_recording).parameters)


def check_rollback(model) -> None:
    """TargetError when `model` has recurrent layers and this transformers cannot roll them back."""
    kinds = recurrent_layer_kinds(model)
    if kinds and not records_recurrent_states():
        import transformers

        raise TargetError(f"transformers {transformers.__version__} cannot roll back the {'/'.join(kinds)} layers of "
                          f"this {model.config.model_type} target (no recurrent-state recording): speculative "
                          f"decoding on it needs transformers >= 5.25; plain decoding still works")


def new_cache(model, *, rolls_back: bool = True) -> DynamicCache:
    """A cache for `model`'s forwards; `rolls_back`: its recurrent layers record past states, so that `rollback`
    can return to any token of the last forward (plain decoding, which never rolls back, leaves them off)."""
    cache = DynamicCache(config=model.config)
    if rolls_back and has_recurrent_layers(cache):
        check_rollback(model)
    for index, layer in enumerate(cache.layers):
        if getattr(layer, "is_sliding", False):
            layer.activate_past_recording()
        elif rolls_back and is_recurrent(layer):
            layer.activate_past_recording(recurrent_states_to_keep=0)
        elif rolls_back and not getattr(layer, "is_croppable", True):
            if not records_recurrent_states():  # before 5.25 a hybrid's layers are neither recurrent nor croppable
                raise TargetError(f"transformers cannot roll back layer {index} of this {model.config.model_type} "
                                  f"target: speculative decoding on it needs transformers >= 5.25; plain decoding "
                                  f"still works")
            kind = getattr(model.config, "layer_types", [None] * len(cache.layers))[index]
            raise TargetError(f"layer {index} of this {model.config.model_type} target "
                              f"({kind or type(layer).__name__}) "
                              f"keeps a cache that cannot be rolled back, so drafts cannot be verified on it; plain "
                              f"decoding still works")
    return cache


def head_cache(head) -> DynamicCache:
    """An empty cache for a draft head's own forwards: the head's kind where it makes its own (`new_cache`: an MTP
    layer of DeepSeek-V3.2 keeps its lightning indexer's keys), else transformers' default."""
    make = getattr(head, "new_cache", None)
    return make() if make is not None else DynamicCache()


def recurrent_layer_kinds(model) -> list[str]:
    """The kinds of `model`'s layers whose cache holds a recurrent state (its config's layer_types where it has
    them), in layer order without repeats; empty for an attention-only target."""
    layers = DynamicCache(config=model.config).layers
    types = getattr(model.config.get_text_config(), "layer_types", None) or [None] * len(layers)
    kinds = [kind or type(layer).__name__ for layer, kind in zip(layers, types) if is_recurrent(layer)]
    return list(dict.fromkeys(kinds))


def has_recurrent_layers(cache: DynamicCache) -> bool:
    return any(is_recurrent(layer) for layer in cache.layers)


def rolls_back_trees(cache: DynamicCache) -> bool:
    """Whether a tree's accepted path can be kept in this cache (not on recurrent layers)."""
    return not has_recurrent_layers(cache)


def record_states(cache: DynamicCache, tokens: int) -> None:
    """Before a forward over `tokens` tokens that may be rolled back: recurrent layers keep the state after each."""
    for layer in cache.layers:
        if is_recurrent(layer):
            layer.recurrent_states_to_keep = tokens


def seq_length(cache: DynamicCache) -> int:
    """Positions the cache holds, as an int (a recurrent layer's count is a tensor the next forward updates in
    place)."""
    return int(cache.get_seq_length())


@functools.lru_cache(maxsize=None)
def _cache_kwarg(module_cls: type) -> str:
    # transformers 5.24 renamed `past_key_values` to `cache` in forward() (models, decoder layers, attention);
    # 5.0-5.23 take `past_key_values` and silently drop an unknown `cache=`: accept both.
    return "cache" if "cache" in inspect.signature(module_cls.forward).parameters else "past_key_values"


def cache_argument(module, cache) -> dict:
    """`{name: cache}` for the forward of a transformers model, decoder layer or attention module."""
    return {_cache_kwarg(type(module)): cache}


def cache_kwargs(model, cache) -> dict:
    return {**cache_argument(model, cache), "use_cache": True}


def sliding_window(cache: DynamicCache) -> int | None:
    windows = [layer.sliding_window for layer in cache.layers if getattr(layer, "is_sliding", False)]
    return min(windows) if windows else None


def rollback(cache: DynamicCache, keep: int) -> None:
    """Drop every entry after the first `keep` positions (and trim sliding layers back to their window; recurrent
    layers return to their state after position `keep` and drop the states they recorded)."""
    for layer in cache.layers:
        if _holds_nothing(layer):
            continue
        if is_recurrent(layer) or layer.is_initialized:
            layer.crop(-(int(layer.get_seq_length()) - keep))  # crop takes a negative count in transformers 5


def keep_positions(cache: DynamicCache, start: int, offsets: list[int]) -> None:
    """After a forward over positions start.., keep offsets (ascending) of them and drop the rest: the tree's
    accepted path. Entries before `start` are untouched."""
    if offsets == list(range(len(offsets))):
        rollback(cache, start + len(offsets))
        return
    if has_recurrent_layers(cache):
        raise ValueError("a tree's path cannot be kept on recurrent layers: verify chains (rolls_back_trees)")
    for layer in cache.layers:
        if _holds_nothing(layer) or not layer.is_initialized:
            continue
        # keys, values: (B, kv_heads, S_layer, head_dim); the last (seq_length - start) entries are the new ones
        stored = layer.keys.shape[2]
        base = stored - layer.get_seq_length() + start  # where this forward's entries begin in the stored ones
        kept = torch.tensor([base + o for o in offsets], device=layer.keys.device)
        # move the path's entries next to the context and drop the rest: a copy of the path, not of the context
        layer.keys[:, :, base: base + len(offsets)] = layer.keys.index_select(2, kept)
        layer.values[:, :, base: base + len(offsets)] = layer.values.index_select(2, kept)
        layer.keys = layer.keys[:, :, : base + len(offsets)]
        layer.values = layer.values[:, :, : base + len(offsets)]
        indexer = getattr(layer, "indexer_keys", None)  # DeepSeek-V3.2's lightning-indexer keys: (B, S_layer, dim)
        if indexer is not None and indexer.numel():
            indexer[:, base: base + len(offsets)] = indexer.index_select(1, kept)
            layer.indexer_keys = indexer[:, : base + len(offsets)]
        if getattr(layer, "is_sliding", False):
            layer.cumulative_length = start + len(offsets)
            layer.crop(0)  # restrict to the window again
