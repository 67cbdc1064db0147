"""Attention masks over a drafter's own KV cache: causal, training-time test's (EAGLE-3), and a sliding window over
the positions of the keys a head's cache holds (MiMo-V2's MTP layer)."""
from __future__ import annotations

import torch

from draftsmith.serve.core.kv import seq_length
from draftsmith.serve.core.target_masks import additive_mask


def additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """bool mask (True = may attend) -> additive float mask (0 / most negative), (.., Q, K) -> (.., 1, Q, K)."""
    return additive_mask(allowed, dtype).unsqueeze(-3)


def causal_allowed(q_len: int, past: int, *, device=None) -> torch.Tensor:
    """(q_len, past + q_len) bool: query i sits at position past + i and sees keys 0..past + i."""
    keys = torch.arange(past + q_len, device=device)
    queries = torch.arange(q_len, device=device) + past
    return keys[None, :] <= queries[:, None]


def ttt_allowed(seq_len: int, step: int, *, device=None) -> torch.Tensor:
    """(T, (step+1)*T) bool for training-time test step `step` (0-based).

    Keys are [step-0 keys (T) | step-1 keys (T) | ... | step keys (T)]. Row p sees the real context
    causally (step-0 keys 0..p) and, from each later step, only its own column p: the draft tokens
    it produced itself, exactly what it sees at inference time.
    """
    blocks = [causal_allowed(seq_len, 0, device=device)]
    eye = torch.eye(seq_len, dtype=torch.bool, device=device)
    blocks += [eye] * step
    return torch.cat(blocks, dim=1)


def cache_key_positions(cache) -> torch.Tensor | None:
    """(B, S) the positions of the keys a head's cache holds, where its head records them (`key_positions`: a head
    whose layer attends within a window), else None. A rollback crops the cache, not the record, and keeps a prefix:
    the record cut to the cache's length is the cropped cache's."""
    record = getattr(cache, "key_positions", None)
    return None if record is None else record[:, : seq_length(cache)]


def windowed(attention_mask: torch.Tensor, query_positions: torch.Tensor, key_positions: torch.Tensor,
             window: int) -> torch.Tensor:
    """An additive mask (B|1, 1, Q, S) that also hides the keys `window` or more positions behind their query, as
    transformers' sliding-window layers do (key > query - window); positions (B, Q) and (B, S)."""
    near = key_positions[:, None, None, :] > query_positions[:, None, :, None] - window  # (B, 1, Q, S)
    return torch.where(near, attention_mask, torch.finfo(attention_mask.dtype).min)
