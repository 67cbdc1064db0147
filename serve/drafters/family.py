"""The target family's HF building blocks, found by model_type and never forked: the drafter layer's config,
its decoder-layer and rotary classes, and norms like the target's. Anything family-specific stays in transformers."""
from __future__ import annotations

import importlib
import inspect
from typing import Any

import torch
from torch import nn

from serve.errors import DraftsmithError
from serve.target import text_config


def drafter_layer_config(target_config: Any, *, attn_implementation: str = "sdpa") -> dict:
    """The target's text config as a dict, reduced to one full-attention layer: the drafter layer's config."""
    cfg = text_config(target_config).to_dict()
    cfg["num_hidden_layers"] = 1
    if "layer_types" in cfg:
        cfg["layer_types"] = ["full_attention"]  # a drafter layer sees its whole (short) cache
    for key in ("use_cache", "output_hidden_states", "torch_dtype", "dtype", "architectures", "_name_or_path",
                "quantization_config", "auto_map"):
        cfg.pop(key, None)
    cfg["_attn_implementation"] = attn_implementation
    return cfg


def hf_config(layer_config: dict) -> Any:
    from transformers import AutoConfig

    cfg = dict(layer_config)
    model_type = cfg.pop("model_type")
    attn = cfg.pop("_attn_implementation", "sdpa")
    config = AutoConfig.for_model(model_type, **cfg)
    config._attn_implementation = attn
    return config


def _family_module(model_type: str):
    family = model_type[: -len("_text")] if model_type.endswith("_text") else model_type
    try:
        return importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    except ModuleNotFoundError:
        raise DraftsmithError(f"transformers has no modeling module for model_type {model_type!r}") from None


def decoder_layer_class(model_type: str) -> type[nn.Module]:
    """The HF decoder-layer class of a family (e.g. LlamaDecoderLayer for 'llama')."""
    module = _family_module(model_type)
    found = [obj for name, obj in vars(module).items()
             if name.endswith("DecoderLayer") and inspect.isclass(obj) and obj.__module__ == module.__name__]
    if len(found) != 1:
        raise DraftsmithError(f"cannot pick the decoder layer of model_type {model_type!r} "
                              f"(found {[c.__name__ for c in found]})")
    return found[0]


def rotary_class(model_type: str) -> type[nn.Module]:
    module = _family_module(model_type)
    found = [obj for name, obj in vars(module).items()
             if name.endswith("RotaryEmbedding") and inspect.isclass(obj) and obj.__module__ == module.__name__]
    if not found:
        raise DraftsmithError(f"model_type {model_type!r} has no rotary embedding class")
    return found[0]


class Rope(nn.Module):
    """The family's rotary embedding (no stored weights): position_ids -> (cos, sin)."""

    def __init__(self, config: Any):
        super().__init__()
        self.inner = rotary_class(config.model_type)(config=config)
        params = inspect.signature(self.inner.forward).parameters
        # Gemma-3 keeps separate RoPE tables per layer type; the drafter layer is full attention.
        self.layer_type = "full_attention" if "layer_type" in params else None

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.layer_type is not None:
            return self.inner(x, position_ids, self.layer_type)
        return self.inner(x, position_ids)


def norm_like(layer: nn.Module, hidden_size: int, eps: float) -> nn.Module:
    """A fresh norm of the same class as the layer's input norm (RMSNorm flavours differ by family)."""
    source = getattr(layer, "input_layernorm", None) or getattr(layer, "post_attention_layernorm")
    return type(source)(hidden_size, eps=eps)


def rms_eps(config: Any) -> float:
    return float(getattr(config, "rms_norm_eps", None) or getattr(config, "layer_norm_eps", 1e-6))
