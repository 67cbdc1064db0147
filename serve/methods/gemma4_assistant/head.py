"""Gemma 4's assistant as a trained head: transformers' `Gemma4AssistantForCausalLM`, its tensors under transformers'
own names (model.layers.{i}.*, pre_projection, post_projection, lm_head tied to model.embed_tokens: what
`save_pretrained` writes and the engines load), built from the assistant config its HeadConfig holds.

    HeadConfig.layer_config = {"assistant": Gemma4AssistantConfig.to_dict(),
                               "start_from": the shipped assistant folder training started from ("" = fresh),
                               "target_logit_softcapping": the target's final_logit_softcapping (its distribution),
                               "target_sliding_window": how many of its sliding layer's positions it attends to, + 1}

Training starts from a shipped assistant (`model.shipped_drafter=DIR`, checked against the target) or from a fresh
one of the target's shapes (`fresh_assistant_config`).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.core.layers import FINAL
from draftsmith.serve.core.target import Target
from draftsmith.serve.core.target_config import text_config
from draftsmith.serve.drafters.head_config import HeadConfig
from draftsmith.serve.methods.gemma4_assistant.drafter import (LAYER_TYPES, check_pair, read_assistant_config,
                                                               store_layers)

TIED = "lm_head.weight"  # tied to model.embed_tokens.weight: stored once, as save_pretrained does


def assistant_config(stored: dict) -> Any:
    """The Gemma4AssistantConfig a HeadConfig's layer_config["assistant"] describes (SDPA attention)."""
    from transformers import Gemma4AssistantConfig

    try:
        config = Gemma4AssistantConfig.from_dict(dict(stored))
    except (KeyError, TypeError, ValueError) as err:
        raise DraftsmithError(f"draftsmith cannot build a Gemma 4 assistant from its stored config ({err})") from None
    config._attn_implementation = "sdpa"
    return config


class AssistantHead(nn.Module):
    """The assistant's modules, registered under transformers' names (so the state dict is the HF checkpoint's);
    `assistant` is the Gemma4AssistantForCausalLM that drives them, held outside the module tree."""

    def __init__(self, config: HeadConfig):
        super().__init__()
        from transformers import Gemma4AssistantForCausalLM

        self.config = config
        assistant = Gemma4AssistantForCausalLM(assistant_config(config.layer_config["assistant"]))
        object.__setattr__(self, "assistant", assistant)
        for name, module in assistant.named_children():
            self.add_module(name, module)
        self.tied = bool(assistant.config.tie_word_embeddings)
        if assistant.masked_embedding is not None:  # its top-k choice of clusters passes no gradient: kept as shipped
            assistant.masked_embedding.centroids.requires_grad_(False)
        self._register_state_dict_hook(_drop_tied)
        self._register_load_state_dict_pre_hook(_restore_tied, with_module=True)

    def forward(self, inputs_embeds: torch.Tensor, *, position_ids: torch.Tensor, attention_mask: dict,
                shared_kv_states: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """One assistant step for every query at once. inputs_embeds: (B, T, 2H) = cat(target embedding, state);
        position_ids: (B, T); attention_mask: {layer type: (B|1, 1, T, S) additive}; shared_kv_states: {layer type:
        (keys, values) (B, kv_heads, S, head_dim)}. Returns (its last normed state (B, T, h), the next step's state
        (B, T, H))."""
        model = self.assistant
        x = model.pre_projection(inputs_embeds)  # (B, T, h)
        out = model.model(inputs_embeds=x, attention_mask=attention_mask, position_ids=position_ids,
                          shared_kv_states=shared_kv_states, use_cache=False)
        last = out.last_hidden_state  # (B, T, h)
        return last, model.post_projection(last)

    def logits(self, last: torch.Tensor, *, as_drafted: bool = False) -> torch.Tensor:
        """(B, T, h) -> (B, T, V): over the whole vocabulary, or as it drafts (an assistant with ordered embeddings
        scores only the tokens of its top centroids, the others below them all)."""
        model = self.assistant
        if as_drafted and model.masked_embedding is not None:
            return model.masked_embedding(last, model.lm_head.weight)
        return model.lm_head(last)

    def input_hidden(self, hidden_states: dict) -> torch.Tensor:
        return hidden_states[FINAL]

    def start_from_target(self, target: Target) -> str:
        """Given the shipped assistant the recipe names (model.shipped_drafter); what it started from ("": fresh)."""
        folder = self.config.layer_config.get("start_from") or ""
        if not folder:
            return ""
        from transformers import AutoModelForCausalLM

        shipped = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        state = {k: v for k, v in shipped.state_dict().items() if not (self.tied and k == TIED)}
        self.load_state_dict(state)
        return f"the Gemma 4 assistant {folder}"


def _drop_tied(module: AssistantHead, state: dict, prefix: str, local_metadata: dict) -> None:
    if module.tied:
        state.pop(prefix + TIED, None)


def _restore_tied(module: AssistantHead, state: dict, prefix: str, *args) -> None:
    if module.tied and prefix + "model.embed_tokens.weight" in state:
        state[prefix + TIED] = state[prefix + "model.embed_tokens.weight"]


def fresh_assistant_config(target: Target, *, layers: int) -> dict:
    """A Gemma4AssistantConfig (as a dict) for `target`: `layers` decoder layers as wide as the target's, the last
    full attention and the others sliding, each reading the target's store layer of its type with its shapes."""
    from transformers import Gemma4AssistantConfig

    text = text_config(target.config)
    stores = store_layers(text)
    if sorted(stores) != sorted(LAYER_TYPES):
        raise DraftsmithError(f"{target.name} has no layer of each attention type that keeps its own keys and values "
                              f"({dict(stores)}): a Gemma 4 assistant has nothing to attend to")
    sliding, full = (text.per_layer_config[stores[kind]] for kind in ("sliding_attention", "full_attention"))
    types = ["sliding_attention"] * (layers - 1) + ["full_attention"]
    layer = dict(model_type="gemma4_text", vocab_size=text.vocab_size, hidden_size=text.hidden_size,
                 intermediate_size=text.intermediate_size, num_hidden_layers=layers,
                 num_attention_heads=text.num_attention_heads, num_key_value_heads=sliding.num_key_value_heads,
                 head_dim=sliding.head_dim, global_head_dim=full.head_dim, layer_types=types,
                 sliding_window=text.sliding_window, hidden_activation=text.hidden_activation,
                 rms_norm_eps=text.rms_norm_eps, hidden_size_per_layer_input=0, vocab_size_per_layer_input=0,
                 num_kv_shared_layers=layers, rope_parameters=text.rope_parameters,
                 max_position_embeddings=text.max_position_embeddings, pad_token_id=text.pad_token_id,
                 bos_token_id=text.bos_token_id, eos_token_id=text.eos_token_id)
    if full.num_key_value_heads != sliding.num_key_value_heads:  # transformers sets them apart only under this flag
        layer.update(attention_k_eq_v=True, num_global_key_value_heads=full.num_key_value_heads)
    return Gemma4AssistantConfig(text_config=layer, backbone_hidden_size=text.hidden_size).to_dict()


def assistant_head_config(target: Target, *, num_speculative_tokens: int, ttt_steps: int, shipped: str = "",
                          layers: int = 1) -> HeadConfig:
    """The HeadConfig of an assistant for `target`: the shipped one's config (checked against the target: another
    target's assistant is one line) or a fresh one of `layers` layers."""
    text = text_config(target.config)
    if shipped:
        if not Path(shipped).is_dir():
            raise DraftsmithError(f"model.shipped_drafter={shipped}: no such folder (a Gemma 4 assistant folder, "
                                  f"model_type gemma4_assistant)")
        config = read_assistant_config(shipped)
        check_pair(config, target.config, folder=shipped, target_name=target.name)
        stored = config.to_dict()
    else:
        stored = fresh_assistant_config(target, layers=layers)
        check_pair(assistant_config(stored), target.config, folder="(fresh)", target_name=target.name)
    return HeadConfig(method="gemma4_assistant", model_type="gemma4_assistant", hidden_size=text.hidden_size,
                      vocab_size=text.vocab_size, draft_vocab_size=text.vocab_size,
                      num_speculative_tokens=num_speculative_tokens, aux_layer_ids=[FINAL], ttt_steps=ttt_steps,
                      layer_config={"assistant": stored, "start_from": str(shipped),
                                    "target_logit_softcapping": getattr(text, "final_logit_softcapping", None),
                                    "target_sliding_window": int(text.sliding_window)},
                      target_model_type=text.model_type, target_name=target.name,
                      target_config_hash=target.config_hash, target_tokenizer_hash=target.tokenizer_hash)
