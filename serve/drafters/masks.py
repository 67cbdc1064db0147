"""Attention masks over a drafter's own KV cache: causal, and training-time test's (EAGLE-3)."""
from __future__ import annotations

import torch

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
