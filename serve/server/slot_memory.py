"""Giving the slot cache's memory back between requests.

The batch decoder (serve/batch/decoder.py) keeps one KV cache of `max_batch` rows (serve/core/slots.py), sized for
the longest request it has admitted, and grows it without ever shrinking it: after one 8k-token request on the
default target (fp32, 8 slots) it holds 3 GB, kept for requests that need a few MB. Once the batch is empty, a
cache larger than `serve.keep_cache_mb` is dropped (the next request allocates one of its own size), and the freed
memory is handed back to the system: glibc's malloc keeps freed heap pages for reuse unless trimmed, and CUDA's
caching allocator keeps freed blocks unless emptied.
"""
from __future__ import annotations

import ctypes
import functools
import gc
from typing import Any

import torch

DEFAULT_KEEP_MB = 256.0


def cache_bytes(cache: Any) -> int:
    """Bytes held by a SlotCache's buffers (keys, values, indexer keys; 0 for None)."""
    if cache is None:
        return 0
    return sum(t.numel() * t.element_size() for store in cache.stores() for t in store.values())


@functools.lru_cache(maxsize=1)
def _libc() -> Any:
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim  # noqa: B018 (glibc only: musl and macOS lack it)
    except (OSError, AttributeError):
        return None
    return libc


def trim_malloc() -> bool:
    """Return the heap's free pages to the system (glibc's malloc_trim); False where there is no glibc."""
    libc = _libc()
    return bool(libc is not None and libc.malloc_trim(0))


def release_slot_cache(decoder: Any, *, keep_bytes: int | None) -> int:
    """With no request in `decoder` (the caller's to check), drop its slot cache if it holds more than
    `keep_bytes` (None: keep any size) and give the memory back; the bytes dropped (0: kept)."""
    size = cache_bytes(decoder.cache)
    if keep_bytes is None or size <= keep_bytes:
        return 0
    device = next(iter(decoder.cache.keys.values())).device
    decoder.cache = None  # the decoder allocates a new one, of the next request's size, when it admits it
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    else:
        trim_malloc()
    return size
