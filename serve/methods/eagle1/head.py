"""EAGLE-1 head (Li et al. 2024, https://arxiv.org/abs/2401.15077): predicts the target's next feature.

    x = fc(cat([embed(token t+1), feature t]))        (h, 2h) [+ bias]
    feature t+1 ~ layers.0(x)                          one Llama decoder layer, whatever the target's family
                                                       (serve/drafters/draft_layer.py), input_layernorm =
                                                       identity (as vLLM's EAGLE-1)
    logits = target.lm_head(feature t+1)               the target's frozen lm_head, not stored

Features are the target's final normed hidden states (layer id FINAL = -1).
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from draftsmith.serve.drafters.draft_layer import build_layer, draft_layer_config, rotary
from draftsmith.serve.drafters.head_config import HeadConfig
from draftsmith.serve.core.kv import cache_argument
from draftsmith.serve.core.layers import FINAL
from draftsmith.serve.core.target import Target


class Eagle1Head(nn.Module):
    """Stored tensors: fc.weight (h, 2h) [fc.bias], layers.0.* (without input_layernorm)."""

    reads_target_lm_head = True  # its logits are the target's lm_head over its output (EagleDrafter takes it)

    def __init__(self, config: HeadConfig):
        super().__init__()
        self.config = config
        h = config.hidden_size
        self.fc = nn.Linear(2 * h, h, bias=config.fc_bias)
        layer, layer_config = build_layer(config.layer_config)
        if not config.input_layernorm:
            layer.input_layernorm = nn.Identity()  # the fused input is already on the feature scale
        self.layers = nn.ModuleList([layer])
        self.rope = rotary(layer_config)

    def input_hidden(self, hidden_states: dict[int, torch.Tensor]) -> torch.Tensor:
        """The target features the head starts from: the final normed state."""
        return hidden_states[FINAL]

    def forward(self, hidden_states: torch.Tensor, inputs_embeds: torch.Tensor, *, position_ids: torch.Tensor,
                attention_mask: torch.Tensor, cache: Any = None) -> torch.Tensor:
        """hidden_states, inputs_embeds: (B, T, h); position_ids: (B, T); attention_mask: (B|1, 1, T, S) additive.

        Returns the predicted next features (B, T, h).
        """
        x = self.fc(torch.cat([inputs_embeds, hidden_states], dim=-1))  # (B, T, h)
        position_embeddings = self.rope(x, position_ids)
        return self.layers[0](x, attention_mask=attention_mask, position_ids=position_ids,
                              position_embeddings=position_embeddings, **cache_argument(self.layers[0], cache))


def eagle1_config(target: Target, *, fc_bias: bool = False, num_speculative_tokens: int = 5,
                  attn_implementation: str = "sdpa") -> HeadConfig:
    from draftsmith.serve.core.target import text_config

    text = text_config(target.config)
    layer = draft_layer_config(text.to_dict(), attn_implementation=attn_implementation)
    return HeadConfig(method="eagle1", model_type=layer["model_type"], hidden_size=text.hidden_size,
                      vocab_size=text.vocab_size, draft_vocab_size=text.vocab_size,
                      num_speculative_tokens=num_speculative_tokens, aux_layer_ids=[FINAL],
                      input_layernorm=False, fc_bias=fc_bias, layer_config=layer,
                      target_model_type=text.model_type, target_name=target.name, target_config_hash=target.config_hash,
                      target_tokenizer_hash=target.tokenizer_hash)
