"""The draft layer as the Llama config vLLM and SGLang build their EAGLE drafters from.

Both engines implement EAGLE heads with their own Llama decoder layer (vLLM `llama_eagle.py` /
`llama_eagle3.py`, SGLang `llama_eagle.py` / `llama_eagle3.py`), configured from the draft folder's
config.json. Every draftsmith EAGLE head is built on that layer (serve/drafters/draft_layer.py), whatever the
target's family, so the export writes the head's own layer config in the keys the engines read.
"""
from __future__ import annotations

from typing import Any

from draftsmith.serve.drafters.draft_layer import DRAFT_MODEL_TYPE
from draftsmith.serve.drafters.head_config import HeadConfig
from draftsmith.serve.core.errors import DraftsmithError

_COPIED = ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
           "head_dim", "hidden_act", "max_position_embeddings", "rms_norm_eps", "bos_token_id", "eos_token_id",
           "pad_token_id")


def check_llama_like(config: HeadConfig, fmt: str) -> None:
    """Raise unless the drafter's layer loads as the engine's Llama EAGLE layer (a format-2 head always does)."""
    layer = config.layer_config
    family = layer.get("model_type", config.model_type)
    if family != DRAFT_MODEL_TYPE:
        raise DraftsmithError(f"--format {fmt} {config.method}: this drafter's layer is {family!r}, but the engines "
                              f"build the draft layer as a Llama layer: train it again with this draftsmith")
    for flag in ("attention_bias", "mlp_bias"):
        if layer.get(flag):
            raise DraftsmithError(f"--format {fmt}: {flag}=true in the drafter layer; the engines' EAGLE layers "
                                  f"are built without it")


def rope_fields(layer: dict) -> dict[str, Any]:
    """RoPE in both spellings: `rope_parameters` (transformers 5) and `rope_theta`/`rope_scaling` (what
    vLLM and SGLang read through transformers 4 configs). A missing rope_theta silently means 10000 there."""
    params = dict(layer.get("rope_parameters") or {})
    theta = params.get("rope_theta", layer.get("rope_theta"))
    if theta is None:
        raise DraftsmithError("the drafter's layer config has no rope_theta / rope_parameters.rope_theta")
    params.setdefault("rope_theta", float(theta))
    params.setdefault("rope_type", "default")
    scaling = None if params["rope_type"] == "default" else {k: v for k, v in params.items() if k != "rope_theta"}
    return {"rope_theta": float(theta), "rope_scaling": scaling, "rope_parameters": params}


def llama_layer_config(config: HeadConfig) -> dict[str, Any]:
    """The Llama config keys of the draft layer (one layer, untied embeddings, no biases)."""
    layer = config.layer_config
    out: dict[str, Any] = {"model_type": "llama"}
    for key in _COPIED:
        if key in layer:
            out[key] = layer[key]
    if "head_dim" not in out or out["head_dim"] is None:
        out["head_dim"] = layer["hidden_size"] // layer["num_attention_heads"]
    out.update(num_hidden_layers=1, attention_bias=False, mlp_bias=False, tie_word_embeddings=False)
    out.update(rope_fields(layer))
    return out


def expected_layer_shapes(layer: dict, *, prefix: str, qkv_in: int, input_layernorm: bool,
                          hidden_norm: bool) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape of one Llama decoder layer as the engines load it, from config values alone."""
    h, inter = int(layer["hidden_size"]), int(layer["intermediate_size"])
    heads, kv = int(layer["num_attention_heads"]), int(layer.get("num_key_value_heads") or layer["num_attention_heads"])
    hd = int(layer.get("head_dim") or h // heads)
    shapes = {
        f"{prefix}.self_attn.q_proj.weight": (heads * hd, qkv_in),
        f"{prefix}.self_attn.k_proj.weight": (kv * hd, qkv_in),
        f"{prefix}.self_attn.v_proj.weight": (kv * hd, qkv_in),
        f"{prefix}.self_attn.o_proj.weight": (h, heads * hd),
        f"{prefix}.mlp.gate_proj.weight": (inter, h),
        f"{prefix}.mlp.up_proj.weight": (inter, h),
        f"{prefix}.mlp.down_proj.weight": (h, inter),
        f"{prefix}.post_attention_layernorm.weight": (h,),
    }
    if input_layernorm:
        shapes[f"{prefix}.input_layernorm.weight"] = (h,)
    if hidden_norm:
        shapes[f"{prefix}.hidden_norm.weight"] = (h,)
    return shapes
