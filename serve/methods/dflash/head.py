"""DFlash head (Chen et al. 2026, arXiv 2602.06036; z-lab/dflash): a few decoder layers that draft a whole block in
one forward, reading the target's features as keys and values.

    ctx   = hidden_norm(fc(cat(aux features)))          (C, h): one per verified position, computed once
    block = embed([x_a, m, ..., m])                      (B, h): the last verified token x_a, then B-1 mask tokens
    each layer: q, k, v of input_layernorm(block) (q_norm, k_norm per head, rope at positions a..a+B-1);
                keys and values also k_norm(k_proj(ctx)), v_proj(ctx) of every position before a; the block attends
                to all of them and to itself in both directions; residual, post_attention_layernorm, mlp as Qwen3
    logits = lm_head(norm(out))                          the target's lm_head; slot i (1..B-1) drafts x_{a+i}

Embeddings and lm_head are the target's (frozen, not stored). Tensor names follow vLLM's qwen3_dflash and
speculators' DFlashDraftModel: `fc`, `hidden_norm`, `layers.{i}.self_attn.{q,k,v,o}_proj`, `...{q,k}_norm`,
`layers.{i}.{input,post_attention}_layernorm`, `layers.{i}.mlp.*`, `norm`.
"""
from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from torch import nn

from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.core.layers import aux_layers_or_default
from draftsmith.serve.core.target import Target, text_config
from draftsmith.serve.drafters.draft_layer import draft_layer_config, llama_config, rms_norm, rotary
from draftsmith.serve.drafters.head_config import HeadConfig

BLOCK_MAX = 64  # the longest block a config may ask for (the papers use 8-16)

ContextKV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values (B, kv_heads, C, d), rotated


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of x (B, heads, L, d) with cos, sin (B, L, d)."""
    from transformers.models.llama.modeling_llama import rotate_half

    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return x * cos + rotate_half(x) * sin


class DFlashAttention(nn.Module):
    """Qwen3 attention whose keys and values are the context's (computed once per position) and the block's own."""

    def __init__(self, config):
        super().__init__()
        h, d = config.hidden_size, config.head_dim
        self.heads, self.kv_heads, self.head_dim = config.num_attention_heads, config.num_key_value_heads, d
        self.q_proj = nn.Linear(h, self.heads * d, bias=False)
        self.k_proj = nn.Linear(h, self.kv_heads * d, bias=False)
        self.v_proj = nn.Linear(h, self.kv_heads * d, bias=False)
        self.o_proj = nn.Linear(self.heads * d, h, bias=False)
        self.q_norm = rms_norm(d, config.rms_norm_eps)
        self.k_norm = rms_norm(d, config.rms_norm_eps)

    def _split(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        """(B, L, heads * d) -> (B, heads, L, d)."""
        return x.view(*x.shape[:2], heads, self.head_dim).transpose(1, 2)

    def keys_values(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x: (B, L, h) -> rotated keys and values (B, kv_heads, L, d)."""
        k = self.k_norm(self._split(self.k_proj(x), self.kv_heads))
        return _rotate(k, cos, sin), self._split(self.v_proj(x), self.kv_heads)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, context: tuple[torch.Tensor, torch.Tensor],
                mask: torch.Tensor) -> torch.Tensor:
        """x: (B, Q, h) the block; context: keys, values (B, kv_heads, C, d); mask: (B or 1, 1, Q, C + Q) additive."""
        q = _rotate(self.q_norm(self._split(self.q_proj(x), self.heads)), cos, sin)
        k, v = self.keys_values(x, cos, sin)
        k = torch.cat([context[0].to(k.dtype), k], dim=2)
        v = torch.cat([context[1].to(v.dtype), v], dim=2)
        if self.kv_heads != self.heads:  # grouped-query attention
            k = k.repeat_interleave(self.heads // self.kv_heads, dim=1)
            v = v.repeat_interleave(self.heads // self.kv_heads, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.dtype))  # (B, heads, Q, d)
        return self.o_proj(out.transpose(1, 2).reshape(*x.shape[:2], self.heads * self.head_dim))


class DFlashLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaMLP

        self.self_attn = DFlashAttention(config)
        self.mlp = LlamaMLP(config)
        self.input_layernorm = rms_norm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = rms_norm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x, cos, sin, context, mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, context, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashHead(nn.Module):
    """Stored tensors: fc.weight (h, n*h), hidden_norm.weight, layers.{i}.*, norm.weight."""

    reads_target_lm_head = True  # drafts over the target's vocabulary through its lm_head

    def __init__(self, config: HeadConfig):
        super().__init__()
        self.config = config
        layer_config = llama_config(config.layer_config)
        h = config.hidden_size
        self.fc = nn.Linear(len(config.aux_layer_ids) * h, h, bias=False)
        self.hidden_norm = rms_norm(h, layer_config.rms_norm_eps)
        self.layers = nn.ModuleList(DFlashLayer(layer_config) for _ in range(layer_config.num_hidden_layers))
        self.norm = rms_norm(h, layer_config.rms_norm_eps)
        self.rope = rotary(layer_config)

    def context(self, hidden_states: dict[int, torch.Tensor]) -> torch.Tensor:
        """The aux features (..., C, h) each -> the context the block reads (..., C, h)."""
        dtype = self.fc.weight.dtype
        return self.hidden_norm(self.fc(torch.cat([hidden_states[i].to(dtype) for i in self.config.aux_layer_ids],
                                                  dim=-1)))

    def context_kv(self, context: torch.Tensor, positions: torch.Tensor) -> ContextKV:
        """context: (B, C, h) at positions (B, C) -> each layer's keys and values of it."""
        cos, sin = self.rope(context, positions)
        return [layer.self_attn.keys_values(context, cos, sin) for layer in self.layers]

    def forward(self, embeds: torch.Tensor, positions: torch.Tensor, context_kv: ContextKV,
                mask: torch.Tensor) -> torch.Tensor:
        """embeds: (B, Q, h) of the block's tokens at positions (B, Q); mask: (B or 1, 1, Q, C + Q) additive over
        [context | block] -> norm(out) (B, Q, h), what the target's lm_head reads."""
        x = embeds.to(self.fc.weight.dtype)
        cos, sin = self.rope(x, positions)
        for layer, context in zip(self.layers, context_kv):
            x = layer(x, cos, sin, context, mask)
        return self.norm(x)


# the tokenizer's special tokens a block's drafted slots may be filled with, in the order they are chosen
MASK_CANDIDATES = ("mask_token_id", "pad_token_id", "unk_token_id", "eos_token_id")


def choose_mask_token(target: Target, wanted: int = -1) -> tuple[int, str]:
    """(token id, where it came from) of the token filling a block's drafted slots: `wanted` when >= 0, else the
    tokenizer's mask, pad, unk or eos token, the first it has whose embedding row is not zero. Its embedding is the
    target's (frozen): the row must carry something for the slots to tell their positions apart (a padding row is
    often all zeros), and the first of these is the one the tokenizer reserves for it."""
    vocab = text_config(target.config).vocab_size
    embedding = getattr(target.model, "get_input_embeddings", None)
    rows = embedding().weight if embedding is not None else None  # None: a target described by its config alone

    def carries(token: int) -> bool:
        return rows is None or bool(rows[token].detach().abs().sum() > 0)

    if wanted >= 0:
        if wanted >= vocab:
            raise DraftsmithError(f"model.mask_token_id={wanted} is outside the target's vocabulary (0..{vocab - 1})")
        if not carries(wanted):
            raise DraftsmithError(f"model.mask_token_id={wanted}: its embedding row is all zeros, so a block's drafted "
                                  f"slots would carry nothing to tell them apart: pick a token with a trained row")
        return wanted, "model.mask_token_id"
    if target.tokenizer is None:  # sizing a head from a config (train --plan): any id does
        return 0, "a placeholder (the target's tokenizer is not loaded)"
    for name in MASK_CANDIDATES:
        token = getattr(target.tokenizer, name, None)
        if isinstance(token, int) and 0 <= token < vocab and carries(token):
            return token, f"the tokenizer's {name.removesuffix('_id')}"
    raise DraftsmithError("DFlash fills a block's drafted slots with a mask token, and this target's tokenizer has no "
                          "mask, pad, unk or eos token with a non-zero embedding row: set model.mask_token_id to a "
                          "token id the answers never use")


def recipe_mask_token(target: Target, wanted: int, *, method: str, slots: str) -> int:
    """choose_mask_token for a recipe: when the recipe names none (`wanted` < 0), say on stderr which token the
    drafted `slots` hold and how to pick another."""
    mask, source = choose_mask_token(target, wanted)
    if wanted < 0:
        print(f"{method}: {slots} hold token {mask} ({source}); model.mask_token_id picks another", file=sys.stderr)
    return mask


def check_block_size(block_size: int) -> None:
    if not 2 <= block_size <= BLOCK_MAX:
        raise DraftsmithError(f"model.block_size={block_size}: a DFlash block is the last verified token and at "
                              f"least one drafted one, at most {BLOCK_MAX}: pick 2..{BLOCK_MAX} (4-16 are usual)")


def dflash_config(target: Target, *, aux_layer_ids: list[int] | None = None, block_size: int = 8,
                  draft_layers: int = 1, mask_token_id: int = -1, attn_implementation: str = "sdpa") -> HeadConfig:
    """The HeadConfig of a DFlash drafter for `target`: its aux layers (default: EAGLE-3's three, so the same capture
    serves both), `draft_layers` decoder layers shaped like the target's, blocks of `block_size` tokens."""
    text = text_config(target.config)
    n = text.num_hidden_layers
    check_block_size(block_size)
    context = int(getattr(text, "max_position_embeddings", 0) or 0)
    if context and block_size >= context:
        raise DraftsmithError(f"model.block_size={block_size} does not fit the target's context of {context} tokens")
    aux = aux_layers_or_default(aux_layer_ids, n, title="DFlash")
    mask, _ = choose_mask_token(target, mask_token_id)
    layer = draft_layer_config(text.to_dict(), attn_implementation=attn_implementation)
    layer["num_hidden_layers"] = int(draft_layers)
    return HeadConfig(method="dflash", model_type=layer["model_type"], hidden_size=text.hidden_size,
                      vocab_size=text.vocab_size, draft_vocab_size=text.vocab_size,
                      num_speculative_tokens=block_size - 1, aux_layer_ids=aux, block_size=block_size,
                      mask_token_id=mask, layer_config=layer, target_model_type=text.model_type,
                      target_name=target.name, target_config_hash=target.config_hash,
                      target_tokenizer_hash=target.tokenizer_hash)
