"""A target's size from its config alone: the fields a memory plan reads, and parameter counts as pure functions.

Built from an HF config or its dict (`config.json`, or a built-in entry of serve/core/known_configs.py); a
multimodal config's decoder is its `text_config`. Counts follow the Llama-style decoder that every supported family
shares (attention with grouped key/value heads, a gated MLP or a mixture of gated experts, RMSNorms).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from draftsmith.serve.core.errors import TargetError
from draftsmith.serve.core.families import family_of

DTYPE_BYTES = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2}


@dataclass(frozen=True)
class TargetArch:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int        # dense MLP width (0 when every layer is a mixture of experts)
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    tied_embeddings: bool
    num_experts: int = 0          # 0 = dense
    experts_per_token: int = 0
    expert_intermediate_size: int = 0
    attention_bias: bool = False
    qk_norm: bool = False

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def attention_params(self) -> int:
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        bias = (q + 2 * kv) if self.attention_bias else 0
        return self.hidden_size * (q + 2 * kv) + q * self.hidden_size + bias + (2 * self.head_dim if self.qk_norm else 0)

    @property
    def mlp_params(self) -> int:
        if self.is_moe:
            return self.num_experts * 3 * self.hidden_size * self.expert_intermediate_size \
                + self.hidden_size * self.num_experts  # experts + router
        return 3 * self.hidden_size * self.intermediate_size

    @property
    def layer_params(self) -> int:
        return self.attention_params + self.mlp_params + 2 * self.hidden_size  # + two RMSNorms

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def total_params(self) -> int:
        heads = 1 if self.tied_embeddings else 2
        return self.num_layers * self.layer_params + heads * self.embedding_params + self.hidden_size

    def params_b(self) -> float:
        return self.total_params / 1e9


def _get(data: dict, *names: str, default: Any = None) -> Any:
    for name in names:
        if data.get(name) is not None:
            return data[name]
    return default


def arch_of(config: Any) -> TargetArch:
    """TargetArch of an HF config, a config dict, or a config with a `text_config`; TargetError naming a field
    that a plan needs and the config lacks."""
    data = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    if isinstance(data.get("text_config"), dict):
        data = {**data["text_config"], "model_type": data["text_config"].get("model_type", data.get("model_type"))}
    model_type = str(data.get("model_type", "llama"))
    family = family_of(model_type)  # serve/core/families.py: what its decoder has beyond Llama's
    if family is not None and family.refused:
        raise TargetError(f"a {model_type!r} target is one draftsmith does not load: {family.refused}")
    if family is not None and not family.planned:
        raise TargetError(f"the memory plan does not model a {model_type!r} target's decoder yet (recurrent layers, "
                          f"per-layer embeddings, latent attention, shared experts or head sizes), and splitting one "
                          f"over processes is untested: run without --plan, with target.parallel=none (each process "
                          f"holds the whole target)")
    missing = [f for f in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads") if f not in data]
    if missing:
        raise TargetError(f"the target's config lacks {', '.join(missing)}: a memory plan needs a decoder config")
    hidden, heads = int(data["hidden_size"]), int(data["num_attention_heads"])
    experts = int(_get(data, "num_experts", "num_local_experts", "n_routed_experts", default=0) or 0)
    return TargetArch(
        model_type=model_type, vocab_size=int(data["vocab_size"]), hidden_size=hidden,
        intermediate_size=int(_get(data, "intermediate_size", default=0) or 0), num_layers=int(data["num_hidden_layers"]),
        num_heads=heads, num_kv_heads=int(_get(data, "num_key_value_heads", default=heads)),
        head_dim=int(_get(data, "head_dim", default=hidden // heads)),
        tied_embeddings=bool(data.get("tie_word_embeddings", False)), num_experts=experts,
        experts_per_token=int(_get(data, "num_experts_per_tok", "experts_per_token", default=0) or 0),
        expert_intermediate_size=int(_get(data, "moe_intermediate_size", "intermediate_size", default=0) or 0)
        if experts else 0,
        attention_bias=bool(data.get("attention_bias", family is not None and family.attention_bias)),
        qk_norm=family is not None and family.qk_norm)


def dtype_bytes(dtype: str) -> int:
    if dtype not in DTYPE_BYTES:
        raise TargetError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPE_BYTES)}")
    return DTYPE_BYTES[dtype]
