"""EAGLE-3 head (Li et al. 2025, https://arxiv.org/abs/2503.01840): fuses low, middle and high target layers.

    fused = fc(cat(aux features))                      (h, 3h), once per real position
            optionally fc_norm.{i}(aux i) before the cat    (EAGLE-3.1: the aux layers' scales differ by 10x)
            and/or input_norm(cat(...)) after it           (`norm_before_fc`, as speculators / gpt-oss)
    a     = cat([input_layernorm(embed(token t+1)), hidden_norm(fused)])     (2h): q/k/v take width 2h
    out   = midlayer(a) with residual = fused          one Llama decoder layer, whatever the target's family
    logits = lm_head(norm(out))                        own lm_head over a reduced draft vocabulary
    target_id = draft_id + d2t[draft_id]; t2d marks target ids inside the draft vocabulary

During drafting (and training-time test) `out` replaces `fused` for the next step; with `norm_output` (EAGLE-3.1,
vLLM's and SGLang's `norm_output`) `norm(out)` does, which keeps its scale from drifting over the steps: the head's
forward then returns norm(out) and `logits` applies lm_head alone. Tensor names follow vLLM's llama_eagle3
(`midlayer.*`, `midlayer.hidden_norm`, `fc`, `norm`, `lm_head`, `d2t`, `t2d`).
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from draftsmith.serve.drafters.draft_layer import build_layer, draft_layer_config, rms_norm, rotary
from draftsmith.serve.drafters.head_config import HeadConfig
from draftsmith.serve.drafters.vocab import identity_vocab
from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.core.kv import cache_argument
from draftsmith.serve.core.layers import aux_layers_or_default
from draftsmith.serve.core.target import Target, text_config

_WIDE_INPUTS = ("q_proj", "k_proj", "v_proj", "qkv_proj")


def widen_attention_inputs(attn: nn.Module, hidden_size: int) -> None:
    """Replace q/k/v (or fused qkv) projections by ones reading 2h features (same outputs, fresh init)."""
    replaced = 0
    for name in _WIDE_INPUTS:
        proj = getattr(attn, name, None)
        if isinstance(proj, nn.Linear):
            setattr(attn, name, nn.Linear(2 * hidden_size, proj.out_features, bias=proj.bias is not None))
            replaced += 1
    if not replaced:
        raise DraftsmithError(f"{type(attn).__name__} has none of {_WIDE_INPUTS}; EAGLE-3 cannot widen its inputs")


class Eagle3Head(nn.Module):
    """Stored tensors: fc.weight (h, 3h), midlayer.*, norm.weight, lm_head.weight (Vd, h), d2t (Vd,), t2d (V,);
    fc_norm.{i}.weight (h,) when config.fc_norm, input_norm.weight (3h,) when config.norm_before_fc."""

    reads_target_lm_head = False  # its own lm_head over the draft vocabulary

    def __init__(self, config: HeadConfig):
        super().__init__()
        self.config = config
        h = config.hidden_size
        n_aux = len(config.aux_layer_ids)
        self.fc = nn.Linear(n_aux * h, h, bias=False)
        layer, layer_config = build_layer(config.layer_config)
        eps = layer_config.rms_norm_eps
        self.fc_norm = nn.ModuleList(rms_norm(h, eps) for _ in range(n_aux)) if config.fc_norm else None
        self.input_norm = rms_norm(n_aux * h, eps) if config.norm_before_fc else None
        widen_attention_inputs(layer.self_attn, h)
        layer.hidden_norm = rms_norm(h, eps) if config.hidden_norm else nn.Identity()
        self.midlayer = layer
        self.norm = rms_norm(h, eps)
        self.lm_head = nn.Linear(h, config.draft_vocab_size, bias=False)
        d2t, t2d = identity_vocab(config.vocab_size)
        self.register_buffer("d2t", d2t[: config.draft_vocab_size].clone())
        self.register_buffer("t2d", t2d)
        self.rope = rotary(layer_config)

    def set_vocab(self, d2t: torch.Tensor, t2d: torch.Tensor) -> None:
        self.d2t.copy_(d2t)
        self.t2d.copy_(t2d)

    def input_hidden(self, hidden_states: dict[int, torch.Tensor]) -> torch.Tensor:
        """cat of the aux layers in config order (..., 3h) -> fused (..., h)."""
        dtype = self.fc.weight.dtype
        aux = [hidden_states[i].to(dtype) for i in self.config.aux_layer_ids]
        if self.fc_norm is not None:
            aux = [norm(x) for norm, x in zip(self.fc_norm, aux)]
        x = torch.cat(aux, dim=-1)  # (..., n_aux * h)
        if self.input_norm is not None:
            x = self.input_norm(x)
        return self.fc(x)

    def forward(self, hidden_states: torch.Tensor, inputs_embeds: torch.Tensor, *, position_ids: torch.Tensor,
                attention_mask: torch.Tensor, cache: Any = None) -> torch.Tensor:
        """hidden_states: fused or previous output (B, T, h); inputs_embeds: (B, T, h) -> out (B, T, h)."""
        layer = self.midlayer
        residual = hidden_states
        x = torch.cat([layer.input_layernorm(inputs_embeds), layer.hidden_norm(hidden_states)], dim=-1)  # (B,T,2h)
        position_embeddings = self.rope(hidden_states, position_ids)
        x, _ = layer.self_attn(hidden_states=x, position_embeddings=position_embeddings,
                               attention_mask=attention_mask, position_ids=position_ids,
                               **cache_argument(layer.self_attn, cache))
        x = residual + x
        residual = x
        x = layer.mlp(layer.post_attention_layernorm(x))
        out = residual + x
        return self.norm(out) if self.config.norm_output else out

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        """(..., h) forward's output -> (..., Vd) over the draft vocabulary."""
        return self.lm_head(out if self.config.norm_output else self.norm(out))


def eagle3_config(target: Target, *, draft_vocab_size: int | None = None, aux_layer_ids: list[int] | None = None,
                  num_speculative_tokens: int = 5, ttt_steps: int = 7, fc_norm: bool = False,
                  norm_before_fc: bool = False, norm_output: bool = False,
                  attn_implementation: str = "sdpa") -> HeadConfig:
    text = text_config(target.config)
    n = text.num_hidden_layers
    aux = aux_layers_or_default(aux_layer_ids, n, title="EAGLE-3")
    vd = int(draft_vocab_size or text.vocab_size)
    if not 0 < vd <= text.vocab_size:
        raise DraftsmithError(f"draft_vocab_size {vd} must be in 1..{text.vocab_size} (the target's vocabulary)")
    layer = draft_layer_config(text.to_dict(), attn_implementation=attn_implementation)
    return HeadConfig(method="eagle3", model_type=layer["model_type"], hidden_size=text.hidden_size,
                      vocab_size=text.vocab_size, draft_vocab_size=vd, num_speculative_tokens=num_speculative_tokens,
                      aux_layer_ids=aux, input_layernorm=True, hidden_norm=True, ttt_steps=ttt_steps,
                      fc_norm=fc_norm, norm_before_fc=norm_before_fc, norm_output=norm_output, layer_config=layer,
                      target_model_type=text.model_type, target_name=target.name, target_config_hash=target.config_hash,
                      target_tokenizer_hash=target.tokenizer_hash)
