"""KV-cache handling for verification: creating the cache, rolling back rejected positions, keeping a tree path.

Sliding-window layers (Gemma 2/3, Mistral variants) keep only their last window; they are created with past
recording on so that rejected positions can still be rolled back once the window is full.
"""
from __future__ import annotations

import functools
import inspect

import torch
from transformers import DynamicCache


def new_cache(model) -> DynamicCache:
    cache = DynamicCache(config=model.config)
    for layer in cache.layers:
        if getattr(layer, "is_sliding", False):
            layer.activate_past_recording()
    return cache


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
    """Drop every entry after the first `keep` positions (and trim sliding layers back to their window)."""
    for layer in cache.layers:
        if layer.is_initialized:
            layer.crop(-(layer.get_seq_length() - keep))  # crop takes a negative count in transformers 5


def keep_positions(cache: DynamicCache, start: int, offsets: list[int]) -> None:
    """After a forward over positions start.., keep offsets (ascending) of them and drop the rest: the tree's
    accepted path. Entries before `start` are untouched."""
    if offsets == list(range(len(offsets))):
        rollback(cache, start + len(offsets))
        return
    for layer in cache.layers:
        if not layer.is_initialized:
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
        if getattr(layer, "is_sliding", False):
            layer.cumulative_length = start + len(offsets)
            layer.crop(0)  # restrict to the window again
