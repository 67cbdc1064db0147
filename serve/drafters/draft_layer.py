"""The draft layer of every EAGLE head, whatever the target's family: transformers' `LlamaDecoderLayer`, configured
from the target's text config.

That is the layer vLLM (`llama_eagle.py`, `llama_eagle3.py`) and SGLang (`llama_eagle.py`, `llama_eagle3.py`) build
for their EAGLE drafters, and what SpecForge and speculators train for Qwen3, Qwen3-MoE, gpt-oss and Llama-4 targets:
what draftsmith trains is what the engines serve. The target's family matters only on the target side (which hidden
states are captured, its embedding scale, its final norm); none of its layer quirks (q/k norms, q/k/v biases, sandwich
norms, sliding windows, experts) is copied into the draft layer, which is trained from scratch.
"""
from __future__ import annotations

from typing import Any

from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.core.target import Target

DRAFT_MODEL_TYPE = "llama"
# the engines' Llama MLP accepts silu alone (vLLM and SGLang `LlamaMLP`: "Only silu is supported for now")
DRAFT_ACT = "silu"
# Config keys that name a mixture of experts; the draft layer is dense (DESIGN: "MoE: a dense size, e.g. 3x hidden").
_EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")
_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")
UNROTATED_TARGET_THETA = 10000.0  # LlamaConfig's default rope_theta


def is_moe(text: dict) -> bool:
    return any(int(text.get(key) or 0) > 0 for key in _EXPERT_KEYS)


def draft_rope(text: dict) -> dict[str, Any]:
    """The target's RoPE for full-attention layers as transformers-5 `rope_parameters` (theta, type, scaling); for a
    target whose attention has no rotary positions, Llama's default (the draft layer's own, saved in its config,
    which is what the engines read).

    Gemma-3 keeps one table per layer type ({"full_attention": {...}, "sliding_attention": {...}}); the draft
    layer attends to its whole (short) cache, so it takes the full-attention one."""
    params = text.get("rope_parameters") or {}
    if isinstance(params.get("full_attention"), dict):
        params = params["full_attention"]
    params = dict(params)
    theta = params.get("rope_theta", text.get("rope_theta"))
    if theta is None:  # attention without positions (Nemotron-H: its Mamba layers carry the order)
        params = {"rope_type": "default"}
        theta = UNROTATED_TARGET_THETA
    params["rope_theta"] = float(theta)
    params.setdefault("rope_type", "default")
    params.pop("partial_rotary_factor", None)  # Phi's partial rotary is the target's quirk: the draft rotates all
    return params


def draft_layer_config(text: dict, *, attn_implementation: str = "sdpa") -> dict[str, Any]:
    """The Llama config (as a dict) of the one draft decoder layer for a target whose text config is `text`.

    Equal to the target's: vocab_size, hidden_size, num_attention_heads, num_key_value_heads and head_dim (vLLM keeps
    one KV-cache layout for target and draft), rms_norm_eps, max_position_embeddings, RoPE, bos/eos/pad ids.
    intermediate_size is the target's, or 3 x hidden for a mixture-of-experts target; the activation is silu."""
    model_type = text.get("model_type", "?")
    missing = [k for k in ("vocab_size", "hidden_size", "num_attention_heads") if not text.get(k)]
    if missing:
        raise DraftsmithError(f"the target's text config ({model_type!r}) lacks {missing}: not a decoder-only "
                              f"language model draftsmith can draft for (a vision-language config needs its "
                              f"`text_config`)")
    hidden, heads = int(text["hidden_size"]), int(text["num_attention_heads"])
    head_dim = text.get("head_dim")
    if not head_dim:
        if hidden % heads:
            raise DraftsmithError(f"the target's config ({model_type!r}) has hidden_size {hidden}, not a multiple of "
                                  f"num_attention_heads {heads}, and no head_dim: add the target's real head_dim to "
                                  f"its config.json")
        head_dim = hidden // heads
    inter = 3 * hidden if is_moe(text) or not text.get("intermediate_size") else int(text["intermediate_size"])
    layer = {
        "model_type": DRAFT_MODEL_TYPE,
        "vocab_size": int(text["vocab_size"]),
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": 1,
        "num_attention_heads": heads,
        "num_key_value_heads": int(text.get("num_key_value_heads") or heads),
        "head_dim": int(head_dim),
        "hidden_act": DRAFT_ACT,
        "max_position_embeddings": int(text.get("max_position_embeddings") or 4096),
        "rms_norm_eps": float(text.get("rms_norm_eps") or text.get("layer_norm_eps") or 1e-6),
        "rope_parameters": draft_rope(text),
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "_attn_implementation": attn_implementation,
    }
    for key in _IDS:
        if text.get(key) is not None:
            layer[key] = text[key]
    return layer


def llama_config(layer_config: dict) -> Any:
    """The transformers LlamaConfig of a draft layer config (DraftsmithError for a layer of another family)."""
    from transformers import LlamaConfig

    cfg = dict(layer_config)
    model_type = cfg.pop("model_type", DRAFT_MODEL_TYPE)
    if model_type != DRAFT_MODEL_TYPE:
        raise DraftsmithError(f"the drafter's layer is a {model_type!r} layer; draftsmith builds every EAGLE head on "
                              f"a Llama layer (what vLLM and SGLang serve): convert or retrain the drafter")
    attn = cfg.pop("_attn_implementation", "sdpa")
    config = LlamaConfig(**cfg)
    config._attn_implementation = attn
    return config


def build_layer(layer_config: dict):
    """(LlamaDecoderLayer, its LlamaConfig) for a draft layer config."""
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    config = llama_config(layer_config)
    return LlamaDecoderLayer(config, layer_idx=0), config


def rotary(config: Any):
    """The draft layer's rotary embedding (no stored weights): (x, position_ids) -> (cos, sin)."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    return LlamaRotaryEmbedding(config=config)


def rms_norm(hidden_size: int, eps: float):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    return LlamaRMSNorm(hidden_size, eps=eps)


class SharedEmbedding:
    """The target's token embeddings as vLLM and SGLang share them with a draft: a plain lookup of the weight.

    Gemma multiplies by sqrt(hidden) inside its embedding module; the engines share only the weight tensor (SGLang
    `set_embed`, vLLM's shared `embed_tokens`), so the draft trains and drafts on the unscaled rows."""

    def __init__(self, embedding: Any):
        self.weight = embedding.weight  # (V, h), the target's own tensor (not a copy)

    @property
    def num_embeddings(self) -> int:
        return int(self.weight.shape[0])

    def __call__(self, input_ids: Any) -> Any:
        import torch.nn.functional as F

        return F.embedding(input_ids, self.weight)


def shared_embedding(target: Target) -> SharedEmbedding:
    return SharedEmbedding(target.model.get_input_embeddings())
