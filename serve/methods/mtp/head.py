"""MTP head: the target's own multi-token-prediction layer (DeepSeek-V3 §2.2; Qwen3-Next, Qwen3.5, GLM-4.5,
ERNIE-4.5, Nemotron-H, MiMo-V2-Flash), as the target ships it or fresh, drafting K tokens by running its one layer K
times (as vLLM's `*_mtp` drafters do).

    x = eh_proj(cat([enorm(embed(token t+1)), hnorm(feature t)]))   (h, 2h), no bias
    y = mtp_block(x)                                                 one decoder layer of the target's own family
    logits = target.lm_head(post_norm(y))                            the target's frozen lm_head, not stored
    the next step reads post_norm(y) (norm_output: Qwen3-Next, Qwen3.5, DeepSeek-V3, GLM-4.5, Nemotron-H, MiMo-V2)
    ERNIE-4.5's layer has no post_norm (its layer config's mtp_post_norm: false): the lm_head and the next step
    read y, as vLLM and SGLang draft with it

Nemotron-H's step is several of its blocks (`mtp_layers_block_type`, e.g. attention then experts: vLLM's
nemotron_h_mtp.py): mtp_block is then that stack (MtpBlocks), the projections before its first block and post_norm
(vLLM's final_layernorm) after its last, the blocks' tensors under layers.0.mtp_block.{i}.*.

MiMo-V2's layer is one of its sliding-window layers: it attends to the keys of the last `window` positions of its
cache (its layer config's sliding_window, the query's own included), as transformers' sliding layers and SGLang do.

Features are the target's final normed hidden states (layer id FINAL = -1), what the engines hand their MTP layers.
The layer is transformers' `MtpLayer` (modeling_layers.py) around the family's decoder layer class, so its tensors
carry transformers' names: layers.0.{enorm,hnorm,eh_proj,post_norm}.weight and layers.0.mtp_block.* (experts fused as
transformers holds them; shipped.py converts to and from a checkpoint's names).
"""
from __future__ import annotations

import inspect
from typing import Any, NamedTuple

import torch
from torch import nn
from transformers import DynamicCache
from transformers.cache_utils import DYNAMIC_LAYER_TYPE_MAPPING

from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.core.kv import cache_argument, seq_length
from draftsmith.serve.core.layers import FINAL
from draftsmith.serve.core.target import Target
from draftsmith.serve.drafters.head_config import HeadConfig
from draftsmith.serve.drafters.masks import cache_key_positions, windowed
from draftsmith.serve.methods.mtp.blocks import STEP_BLOCKS, MtpBlocks, step_blocks

# what a layer config drops from the target's text config: it describes one decoder layer, not the whole model
_WHOLE_MODEL = ("architectures", "transformers_version", "auto_map", "_name_or_path", "dtype", "torch_dtype")


def layer_config_dict(text: Any, *, overrides: dict | None = None) -> dict:
    """The config of one MTP layer of a target whose text config is `text` (a transformers config), as a dict: the
    target's own, one layer deep, its attention full (an MTP layer attends to its whole cache), `overrides` applied
    (a form's, e.g. DeepSeek's experts from the first layer on). A family whose step is several blocks (STEP_BLOCKS)
    gets them as its layers, its blocks 0..n-1 built as its own layers of those types (as vLLM builds them)."""
    cfg = {k: v for k, v in text.to_dict().items() if k not in _WHOLE_MODEL}
    blocks = list(getattr(text, STEP_BLOCKS, None) or ())
    cfg["num_hidden_layers"] = len(blocks) or 1
    if blocks:  # Nemotron-H names its layer types layers_block_type
        cfg["layers_block_type" if "layers_block_type" in cfg else "layer_types"] = blocks
    elif cfg.get("layer_types"):  # full attention, or DeepSeek-V3.2's indexed attention (over the whole cache too)
        cfg["layer_types"] = ["indexed_attention" if "indexed_attention" in cfg["layer_types"] else "full_attention"]
    if cfg.get("mlp_layer_types"):  # one entry per layer: the one layer's (the target's first, as for V3's layer 0)
        cfg["mlp_layer_types"] = cfg["mlp_layer_types"][:1]
    # MtpLayer's norms read rms_norm_eps; Nemotron-H's is layer_norm_epsilon (vLLM's enorm, hnorm, final_layernorm)
    if "rms_norm_eps" not in cfg and "layer_norm_epsilon" in cfg:
        cfg["rms_norm_eps"] = cfg["layer_norm_epsilon"]
    cfg.update(overrides or {})
    return cfg


def layer_config(config: dict) -> Any:
    """The transformers config a stored layer config rebuilds (SDPA attention)."""
    from transformers import AutoConfig

    cfg = dict(config)
    model_type = cfg.pop("model_type", "")
    attn = cfg.pop("_attn_implementation", "sdpa")
    try:
        built = AutoConfig.for_model(model_type, **cfg)
    except (KeyError, ValueError, AttributeError) as err:
        raise DraftsmithError(f"draftsmith cannot build an MTP layer of {model_type!r} from its config ({err})") \
            from None
    built._attn_implementation = attn
    return built


class FamilyParts(NamedTuple):
    layer: type                   # the decoder layer class
    norm: type                    # its RMSNorm class
    rope: Any                     # its rotary embedding class, or None
    initialize: Any               # the family's weight initializer: module -> None
    fp32: tuple[str, ...]         # tensor-name globs it keeps in float32 in half precision (MoE routers' gates)


def family_parts(config: Any) -> FamilyParts:
    """The parts of the family `config` describes, read from its transformers model built on the meta device
    (nothing allocated), as transformers' MtpModel reads them."""
    from transformers import AutoModel

    try:
        with torch.device("meta"):
            base = AutoModel.from_config(config)
    except ValueError as err:  # a family without SDPA attention (gpt-oss): its eager attention
        if config._attn_implementation == "eager":
            raise DraftsmithError(f"draftsmith cannot build an MTP layer of {config.model_type!r}: {err}") from None
        config._attn_implementation = "eager"
        with torch.device("meta"):
            base = AutoModel.from_config(config)
    base = base.get_decoder() if hasattr(base, "get_decoder") else base
    layers = getattr(base, "layers", None)
    if layers is None or not len(layers):
        raise DraftsmithError(f"a {config.model_type!r} model has no decoder layers draftsmith can build an MTP "
                              f"layer from")
    norm = getattr(base, "norm", None)
    norm_cls = type(norm) if isinstance(norm, nn.Module) else next(
        type(m) for name, m in layers[-1].named_modules() if "norm" in name)
    rope = getattr(base, "rotary_emb", None)
    fp32 = tuple(sorted(getattr(base, "_keep_in_fp32_modules_strict", None) or ()))
    return FamilyParts(type(layers[-1]), norm_cls, type(rope) if rope is not None else None, base._init_weights, fp32)


def float32_names(module: nn.Module, globs: tuple[str, ...]) -> list[str]:
    """The parameters and buffers of `module` that the globs name, matched as transformers' loader matches its
    `_keep_in_fp32_modules_strict` (a search of each glob, `*` for any run of characters)."""
    if not globs:
        return []
    from transformers.core_model_loading import build_glob_alternation

    pattern = build_glob_alternation(list(globs))[0]
    named = [*module.named_parameters(), *module.named_buffers()]
    return [name for name, tensor in named if tensor.is_floating_point() and pattern.search(name)]


class MtpHead(nn.Module):
    """Stored tensors: layers.0.enorm.weight, layers.0.hnorm.weight, layers.0.eh_proj.weight (h, 2h),
    layers.0.mtp_block.* (the family's decoder layer, or MtpBlocks: .{i}.*), layers.0.post_norm.weight (unless its
    layer config says mtp_post_norm: false)."""

    reads_target_lm_head = True  # its logits are the target's lm_head over lm_head_input(out) (EagleDrafter)

    def __init__(self, config: HeadConfig):
        super().__init__()
        from transformers.modeling_layers import MtpLayer

        self.config = config
        built = layer_config(config.layer_config)
        layer_cls, norm_cls, rope_cls, initialize, self.fp32 = family_parts(built)
        if step_blocks(built):
            block_cls = layer_cls
            layer_cls = lambda config, layer_idx: MtpBlocks(config, block_cls)  # noqa: E731
        try:
            self.layers = nn.ModuleList([MtpLayer(built, layer_cls, norm_cls, 0,
                                                  use_post_norm=bool(getattr(built, "mtp_post_norm", True)))])
        except (AttributeError, TypeError, ValueError) as err:
            raise DraftsmithError(f"draftsmith cannot build an MTP layer of {built.model_type!r}: {err}") from None
        with torch.no_grad():  # as the family initializes its own layers (experts are created uninitialized)
            for module in self.layers.modules():
                initialize(module)
        self.rope = rope_cls(config=built) if rope_cls is not None else None
        self.hidden_first = bool(getattr(built, "mtp_hidden_states_first", False))
        # a layer whose cache holds more than keys and values (DeepSeek-V3.2's: its lightning indexer's keys)
        self.cache_layer = (DYNAMIC_LAYER_TYPE_MAPPING["indexed_attention"]
                            if list(getattr(built, "layer_types", None) or ()) == ["indexed_attention"] else None)
        # a family whose RoPE differs per layer type (MiMo-V2) is asked for its layer's
        self.rope_kwargs = ({"layer_type": built.layer_types[0]} if rope_cls is not None and "layer_type" in
                            inspect.signature(rope_cls.forward).parameters else {})
        # a sliding-window layer (MiMo-V2's) sees the keys of its last `window` positions only: its cache records its
        # keys' positions and forward hides the older ones in the mask (the eager attention such families run reads
        # the window from the mask alone), the cache itself kept whole
        self.window = getattr(getattr(self.layers[0].mtp_block, "self_attn", None), "sliding_window", None)

    def to(self, *args, **kwargs):
        """nn.Module.to, except that the tensors the family keeps in float32 in half precision (its transformers
        class's `_keep_in_fp32_modules_strict`: the MoE router's gate and score bias) stay in float32, as transformers
        loads the target and vLLM builds its MTP layers; the router computes in float32 from them."""
        _, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
        kept = float32_names(self, self.fp32) if dtype in (torch.float16, torch.bfloat16) else []
        tensors = dict([*self.named_parameters(), *self.named_buffers()])
        before = {name: tensors[name].detach().float() for name in kept}  # exact when the head is in float32
        super().to(*args, **kwargs)
        for name, value in before.items():
            owner, _, leaf = name.rpartition(".")
            current = getattr(self.get_submodule(owner), leaf)
            current.data = value.to(current.device)
        return self

    def new_cache(self) -> DynamicCache:
        """An empty cache for the head's forwards (transformers' own, its layer of the head's kind)."""
        cache = DynamicCache()
        if self.cache_layer is not None:
            cache.layer_class_to_replicate = self.cache_layer
        return cache

    def input_hidden(self, hidden_states: dict[int, torch.Tensor]) -> torch.Tensor:
        """The target features the layer starts from: the final normed state."""
        return hidden_states[FINAL]

    def forward(self, hidden_states: torch.Tensor, inputs_embeds: torch.Tensor, *, position_ids: torch.Tensor,
                attention_mask: torch.Tensor, cache: Any = None) -> torch.Tensor:
        """hidden_states, inputs_embeds: (B, T, h); position_ids: (B, T); attention_mask: (B|1, 1, T, S) additive.

        Returns what the next step reads (B, T, h)."""
        layer = self.layers[0]
        parts = [layer.enorm(inputs_embeds), layer.hnorm(hidden_states)]
        x = layer.eh_proj(torch.cat(parts[::-1] if self.hidden_first else parts, dim=-1))  # (B, T, h)
        position_embeddings = self.rope(x, position_ids, **self.rope_kwargs) if self.rope is not None else None
        if self.window is not None:
            attention_mask = self._windowed(attention_mask, position_ids, cache)
        out = layer.mtp_block(x, attention_mask=attention_mask, position_ids=position_ids,
                              position_embeddings=position_embeddings, **cache_argument(layer.mtp_block, cache))
        out = out[0] if isinstance(out, tuple) else out
        return layer.post_norm(out) if self.config.norm_output and layer.post_norm is not None else out

    def _windowed(self, attention_mask: torch.Tensor, position_ids: torch.Tensor, cache: Any) -> torch.Tensor:
        """attention_mask (B|1, 1, T, S + T) hiding the keys `window` or more positions behind their query; the
        cache's record of its keys' positions grows by this forward's."""
        past = cache_key_positions(cache)
        if past is None and cache is not None and seq_length(cache):
            raise DraftsmithError("an MTP layer with a sliding window was given a cache whose keys' positions were not "
                                  "recorded (key_positions): its window cannot be applied")
        keys = position_ids if past is None else torch.cat([past.to(position_ids.device), position_ids], dim=1)
        if cache is not None:
            cache.key_positions = keys  # (B, S + T)
        return windowed(attention_mask, position_ids, keys, self.window)

    def lm_head_input(self, out: torch.Tensor) -> torch.Tensor:
        """(…, h) what forward returned -> the state the target's lm_head reads."""
        norm = self.layers[0].post_norm
        return out if self.config.norm_output or norm is None else norm(out)


def mtp_config(target: Target, *, num_speculative_tokens: int = 3, ttt_steps: int = 3, norm_output: bool = False,
               overrides: dict | None = None) -> HeadConfig:
    from draftsmith.serve.core.target import text_config

    text = text_config(target.config)
    layer = layer_config_dict(text, overrides=overrides)
    return HeadConfig(method="mtp", model_type=text.model_type, hidden_size=text.hidden_size,
                      vocab_size=text.vocab_size, draft_vocab_size=text.vocab_size,
                      num_speculative_tokens=num_speculative_tokens, aux_layer_ids=[FINAL], norm_output=norm_output,
                      ttt_steps=ttt_steps, layer_config=layer, target_model_type=text.model_type,
                      target_name=target.name, target_config_hash=target.config_hash,
                      target_tokenizer_hash=target.tokenizer_hash)
