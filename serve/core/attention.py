"""Verification on a CPU without copying the KV cache: grouped-query attention through SDPA's `enable_gqa`.

A forward over several new tokens on a cached context (a verify forward, a tree, a drafter's catch-up) carries an
attention mask. transformers' `sdpa` attention then repeats every key/value head of the whole cache to the query
heads (`repeat_kv`: a copy of each layer's cache, every forward), because CUDA's fast SDPA kernels take no
grouped heads with a mask; a 1-token step has no mask and skips it. On a CPU, torch's SDPA attends grouped heads
under a mask itself (`enable_gqa`, torch 2.5+), and transformers takes it when `TRANSFORMERS_SDPA_FORCE_GQA=1`.

Measured on the default target (3 key/value heads for 9 query heads, fp32, 1 thread, 256-token context,
`measure_verify_costs` three times each way, alternating): verifying 1 draft cost 1.24-1.25 single-token steps
without the copy and 1.28-1.29 with it, 5 drafts 1.55-1.60 and 1.64-1.66; on a busier hour 2 new tokens cost 1.19
and 1.39 steps. The logits were bit-identical. Every method on the target gets it
(plain decoding, transformers' generate and its prompt lookup, our verification), so it changes what speculation
costs, not the baseline.

In bf16 on a CPU torch's SDPA kernel is slow for what a batched step over a slot cache asks (one query per row, a
few hundred keys): self-distillation's 64-row step of the default target spent 44% of its time there.
`grouped_attention` computes those steps as grouped matmuls in float32; the forwards that decide no token (self-
distillation, capture, online features: serve/core/invariant.py `suspended`) take it.
"""
from __future__ import annotations

import os

import torch

from draftsmith.serve.core.target_config import text_config

FORCE_GQA = "TRANSFORMERS_SDPA_FORCE_GQA"


def torch_has_gqa() -> bool:
    """torch's SDPA takes `enable_gqa` from 2.5 on."""
    major, minor = (int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
    return (major, minor) >= (2, 5)


def grouped_heads(config) -> bool:
    config = text_config(config)
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    return bool(heads and kv_heads and kv_heads < heads)


def gqa_wanted(model) -> bool:
    """Whether `model` (loaded) runs faster with SDPA's own grouped-query attention: sdpa attention on the CPU with
    fewer key/value heads than query heads."""
    param = next(model.parameters(), None)
    return (param is not None and param.device.type == "cpu" and torch_has_gqa()
            and getattr(model.config, "_attn_implementation", None) == "sdpa" and grouped_heads(model.config))


def use_cpu_gqa(model) -> bool:
    """Turn transformers' SDPA grouped-query switch on for `model` when `gqa_wanted` (process-wide: it is read at
    every attention call), unless the user set it. Returns whether it is on."""
    if gqa_wanted(model):
        os.environ.setdefault(FORCE_GQA, "1")
    return os.environ.get(FORCE_GQA) == "1"


# ---- few queries over a long cache, on a CPU in bf16/fp16: grouped matmuls ------------------------------------------

GROUPED = "draftsmith_grouped"  # the attention implementation registered with transformers
FEW_QUERIES = 32  # at most this many queries per row take the grouped matmuls; longer forwards (prefills) SDPA
CHUNK_BYTES = 8 << 20  # float32 copies of keys and values made this many bytes of rows at a time (larger: page faults)


def grouped_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                      **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention interface. query: (B, H, Q, D); key, value: (B, KVH, L, D); attention_mask: None or
    (B, 1, Q, L') bool / additive -> (B, Q, H, D).

    A decoding step of a batch over a long cache (Q of 1 to FEW_QUERIES) as two batched matmuls per key/value head,
    its G query heads and Q queries stacked into one (G*Q, D) block, in float32 as SDPA's CPU kernel accumulates:
    no copy of the cache per query head, and on a 2-core AVX512-BF16 EPYC 3-4x faster than torch's bf16 SDPA kernel
    over 64 rows of 150-600 keys, with the same error against a float32 reference. Rows go in chunks, each reading
    only the columns its own rows see (`seen_columns`: a slot cache's short rows beside a long one otherwise attend
    over the long row's). Anything else (a prefill,
    soft-capping, sinks, dropout, an implicit causal mask over several queries) goes to transformers' SDPA."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    batch, heads, queries, dim = query.shape
    kv_heads, keys = key.shape[1], key.shape[2]
    attention_mask = with_indices(attention_mask, kwargs.pop("indices", None), keys)
    if leaves_to_sdpa(module, query, key, attention_mask, dropout, kwargs):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    scale = dim ** -0.5 if scaling is None else scaling
    mask = None if attention_mask is None else attention_mask[..., :keys].expand(batch, 1, queries, keys)
    seen = None if mask is None else seen_columns(mask)  # (B,): a chunk reads its own rows' columns only
    per_row = kv_heads * keys * (key.shape[-1] + value.shape[-1]) * 4
    step = max(1, CHUNK_BYTES // max(1, per_row))
    parts = []
    for start in range(0, batch, step):
        rows = slice(start, start + step)
        width = keys if seen is None else max(1, int(seen[rows].max()))  # the chunk's longest row's columns
        parts.append(grouped_block(query[rows], key[rows, :, :width], value[rows, :, :width],
                                   None if mask is None else mask[rows, ..., :width], scale))
    out = torch.cat(parts) if len(parts) > 1 else parts[0]  # (B, KVH, G*Q, Dv)
    out = out.view(batch, heads, queries, value.shape[-1]).transpose(1, 2)  # (B, Q, H, Dv)
    return out.to(query.dtype).contiguous(), None


def leaves_to_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                   attention_mask: torch.Tensor | None, dropout: float, kwargs: dict) -> bool:
    """Whether a forward is one the grouped float32 block does not compute: more than FEW_QUERIES queries (a
    prefill), dropout, heads that do not group evenly, soft-capping, position biases, sinks, a sparse index left
    unfolded, or an implicit causal mask over several queries."""
    queries, heads, kv_heads = query.shape[2], query.shape[1], key.shape[1]
    return (queries > FEW_QUERIES or bool(dropout) or heads % kv_heads != 0 or kwargs.get("softcap") is not None
            or kwargs.get("position_bias") is not None or kwargs.get("indices") is not None
            or getattr(module, "sinks", None) is not None or (attention_mask is None and queries > 1))


def grouped_block(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
                  scale: float) -> torch.Tensor:
    """Attention in float32 as two batched matmuls per key/value head, its G query heads and Q queries stacked into
    one (G*Q, D) block. query (n, H, Q, D); key, value (n, KVH, L, D|Dv); mask None or (n|1, 1, Q, L) bool /
    additive -> (n, KVH, G*Q, Dv) float32, head = kv*G + g."""
    n, heads, queries, dim = query.shape
    kv_heads, keys = key.shape[1], key.shape[2]
    groups = heads // kv_heads
    q = query.float().reshape(n, kv_heads, groups * queries, dim)  # (n, KVH, G*Q, D)
    scores = torch.matmul(q, key.float().transpose(-1, -2)).mul_(scale)  # (n, KVH, G*Q, L)
    scores = scores.view(n, kv_heads, groups, queries, keys)
    if mask is not None:
        m = mask[:, :, None]  # (n|1, 1, 1, Q, L)
        if m.dtype == torch.bool:
            scores.masked_fill_(~m, torch.finfo(torch.float32).min)
        else:
            scores.add_(m.float())
    probs = torch.softmax(scores, dim=-1).view(n, kv_heads, groups * queries, keys)
    return torch.matmul(probs, value.float())  # (n, KVH, G*Q, Dv)


def seen_columns(mask: torch.Tensor) -> torch.Tensor:
    """(B, 1, Q, L) bool or additive mask -> (B,) long: 1 + the last column any query of the row sees (0: none).
    A slot cache's rows attend over the longest row's columns; a row's own end is where its keys stop."""
    visible = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
    visible = visible.any(dim=2)[:, 0]  # (B, L)
    last = visible.shape[-1] - visible.flip(-1).to(torch.uint8).argmax(-1)  # (B,) 1 + the last True column
    return torch.where(visible.any(-1), last, 0)


def with_indices(attention_mask: torch.Tensor | None, indices: torch.Tensor | None, keys: int) -> torch.Tensor | None:
    """DeepSeek-V3.2's sparse attention: the keys its indexer selected for each query, indices (B, Q, topk), folded
    into the mask (B, 1, Q, L) as transformers folds them for its eager and SDPA attention (any other implementation
    is handed the indices instead of the folded mask)."""
    if indices is None:
        return attention_mask
    batch, queries = indices.shape[:2]
    selected = torch.zeros(batch, queries, keys, dtype=torch.bool, device=indices.device)
    selected = selected.scatter(-1, indices.long(), True)[:, None]  # (B, 1, Q, L)
    if attention_mask is None:
        return selected
    attention_mask = attention_mask[..., :keys]
    if attention_mask.dtype == torch.bool:
        return attention_mask & selected
    return attention_mask.masked_fill(~selected, torch.finfo(attention_mask.dtype).min)


def register_grouped() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(GROUPED, grouped_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(GROUPED, sdpa_mask)  # the same boolean masks SDPA gets


def grouped_wanted(model) -> bool:
    """Whether `model`'s forwards that decide no token should attend with `grouped_attention`: bf16 or fp16 weights
    on a CPU (in float32 torch's SDPA with `enable_gqa` is as fast). Soft-capping and sinks are left to SDPA by
    `grouped_attention` itself, call by call."""
    param = next(model.parameters(), None)
    return param is not None and param.device.type == "cpu" and param.dtype in (torch.bfloat16, torch.float16)
