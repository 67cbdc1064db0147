"""Draft vocabularies: a head's reduced vocabulary maps draft id d to target id d + d2t[d]; t2d marks the target
ids inside it (the layout vLLM and SGLang load)."""
from __future__ import annotations

import torch


def identity_vocab(vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """d2t offsets (all zero) and t2d (all True) for a draft vocabulary equal to the target's."""
    return torch.zeros(vocab_size, dtype=torch.long), torch.ones(vocab_size, dtype=torch.bool)


def draft_token_ids(d2t: torch.Tensor) -> torch.Tensor:
    """(Vd,) target ids of the draft vocabulary: target_id = draft_id + d2t[draft_id]."""
    return torch.arange(d2t.numel(), device=d2t.device) + d2t


def full_vocab_probs(probs: torch.Tensor, d2t: torch.Tensor | None, vocab_size: int) -> torch.Tensor:
    """(.., Vd) probabilities over the draft vocabulary -> (.., V) over the target's, zeros elsewhere."""
    if d2t is None or probs.shape[-1] == vocab_size:
        return probs
    out = probs.new_zeros(*probs.shape[:-1], vocab_size)
    out[..., draft_token_ids(d2t)] = probs
    return out
