"""A drafter head's attention on a CPU: a few queries over its own short cache as grouped matmuls.

A head drafts one token per row at a time (a catch-up: a few), over a cache of a few hundred keys. torch's SDPA
kernel on a CPU is slow for that shape: in bfloat16 with grouped key/value heads (`enable_gqa`, which draftsmith
turns on for the target: serve/core/attention.py) one query over 110 keys costs 11 µs per row and head, and 16
rows of a batch 1.6 ms a forward, against 0.3 ms as two float32 matmuls (the default target's head, 9 query and 3
key/value heads, 1 thread, an AVX512-BF16 EPYC: docs/results.md). `draft_attention` computes those forwards in
float32 as two batched matmuls, without copying the keys to every query head (a head's cache is small: its float32
copy costs little); anything else goes to transformers' SDPA. In bf16 the scores and the weighted values stay in
float32, as SDPA's CPU kernel keeps the scores (a version that kept them in bf16, as transformers' eager attention
does, was 1.4x faster at 16 rows and drafted a held-out μ 0.03 lower at batch 1).

A drafter proposes and the target verifies, so this changes which tokens are drafted, at the last bit, never the
output. Training keeps SDPA: `use_draft_attention` switches a head that serves (serve/drafters/folder.py).
"""
from __future__ import annotations

import torch

from draftsmith.serve.core.attention import grouped_block, leaves_to_sdpa

DRAFT_ATTENTION = "draftsmith_draft"  # the attention implementation registered with transformers


def draft_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                    **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention interface. query: (B, H, Q, D); key, value: (B, KVH, L, D|Dv); attention_mask: None
    or (B|1, 1, Q, L') bool / additive -> (B, Q, H, Dv).

    Per key/value head, its G query heads and Q queries stacked into one (G*Q, D) block: two batched float32
    matmuls for the whole batch. Soft-capping, sinks, position biases, dropout, a sparse index and an implicit
    causal mask over several queries go to transformers' SDPA."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    batch, heads, queries, dim = query.shape
    keys = key.shape[2]
    if leaves_to_sdpa(module, query, key, attention_mask, dropout, kwargs):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    scale = dim ** -0.5 if scaling is None else scaling
    mask = None if attention_mask is None else attention_mask[..., :keys]
    out = grouped_block(query, key, value, mask, scale)  # (B, KVH, G*Q, Dv): the target's forwards' own block
    return out.view(batch, heads, queries, value.shape[-1]).transpose(1, 2).to(query.dtype).contiguous(), None


def register_draft_attention() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(DRAFT_ATTENTION, draft_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(DRAFT_ATTENTION, sdpa_mask)  # the same boolean masks SDPA gets


def use_draft_attention(head: torch.nn.Module) -> bool:
    """On a CPU, every layer of `head` configured for SDPA attends with `draft_attention` (the layers' own
    transformers configs; the drafter's saved config is untouched). Returns whether any layer switched."""
    from transformers import PretrainedConfig

    param = next(head.parameters(), None)
    if param is None or param.device.type != "cpu":
        return False
    configs = {id(c): c for m in head.modules() if isinstance(c := getattr(m, "config", None), PretrainedConfig)}
    switched = [c for c in configs.values() if getattr(c, "_attn_implementation", None) == "sdpa"]
    if switched:
        register_draft_attention()
    for config in switched:
        config._attn_implementation = DRAFT_ATTENTION
    return bool(switched)
