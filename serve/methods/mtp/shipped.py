"""The MTP layers a target ships: where its checkpoint keeps them (one form per family, read from the engines'
loaders: vLLM `qwen3_next_mtp.py` / `qwen3_5_mtp.py` (`mtp.*`), `deepseek_mtp.py` / `glm4_moe_mtp.py`
(`model.layers.{num_hidden_layers}.*`), `ernie_mtp.py` (`model.mtp_*.0.*`), `nemotron_h_mtp.py` (`mtp.layers.{i}.*`,
one per block of the step), `mimo_v2_mtp.py` (`model.mtp.layers.{i}.*`), and transformers' `MtpModel` conversions),
and the conversions between that form and the head's tensors.

The decoder layer inside (a step's blocks) is converted by transformers itself: a one-layer model of the target's
family (a model of the step's blocks) is loaded from the layer's checkpoint tensors (its weight conversions fuse the
experts as transformers holds them) and reverted on the way back (`revert_weight_conversion`, as `save_pretrained`
writes), so a family's quirks live in transformers.
"""
from __future__ import annotations

import json
import logging
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from draftsmith.serve.core.errors import DraftsmithError

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
POST_NORM = "mtp_post_norm"  # a layer-config key: False for a layer whose output the lm_head reads unnormed


@dataclass(frozen=True)
class ShippedForm:
    """How one family's checkpoint holds MTP layer 0."""
    title: str                                   # as messages name the form
    # text-config keys that say how many MTP layers it ships (none: the family's configs name none, and the
    # checkpoint's tensors under the prefix say whether it ships one, as the engines load it: MiMo-V2)
    counts: tuple[str, ...]
    prefix: Callable[[Any], str]                 # text config -> the checkpoint prefix of MTP layer 0
    # checkpoint name after the prefix -> the head's name after layers.0. ({last}: the index of a step's last block)
    parts: Mapping[str, str]
    block: str                                   # the decoder layer's (a step's blocks') names after the prefix
    shared: tuple[str, ...] = ()                 # copies of the target's embeddings / head kept there (not read)
    norm_output: bool = False                    # the next draft step reads the normed output
    overrides: Mapping[str, Any] = field(default_factory=dict)  # layer-config keys that differ from the target's
    renames: Mapping[str, str] = field(default_factory=dict)  # the block's checkpoint names -> transformers' names

    def names(self, layer_config: Any) -> dict[str, str]:
        """parts, a step's last block named (the layer config's last layer)."""
        last = layer_config.num_hidden_layers - 1
        return {theirs.format(last=last): ours for theirs, ours in self.parts.items()}


QWEN = ShippedForm(
    title="Qwen3-Next / Qwen3.5 (mtp.*)", counts=("mtp_num_hidden_layers",), prefix=lambda text: "mtp.",
    parts={"fc.weight": "eh_proj.weight", "pre_fc_norm_embedding.weight": "enorm.weight",
           "pre_fc_norm_hidden.weight": "hnorm.weight", "norm.weight": "post_norm.weight"},
    block="layers.0.", norm_output=True)
DEEPSEEK = ShippedForm(
    title="DeepSeek-V3 / GLM-4.5 (model.layers.{num_hidden_layers}.*)",
    counts=("num_nextn_predict_layers", "num_mtp_layers"),
    prefix=lambda text: f"model.layers.{text.num_hidden_layers}.",
    parts={"enorm.weight": "enorm.weight", "hnorm.weight": "hnorm.weight", "eh_proj.weight": "eh_proj.weight",
           "shared_head.norm.weight": "post_norm.weight"},
    # the next step reads the normed output, as vLLM 0.34 (deepseek_mtp.py, glm4_moe_mtp.py: "GLM MTP recycle
    # contract") and SGLang 0.5.23 (deepseek_nextn.py, glm4_moe_nextn.py) recycle it
    block="", shared=("embed_tokens.weight", "shared_head.head.weight"), norm_output=True,
    overrides={"first_k_dense_replace": 0})  # the MTP layer holds experts like the target's last layers
# DeepSeek-V3.2 keeps its layer as V3 does (vLLM's DeepseekV32MTP, deepseek_v32/nvidia/mtp.py; SGLang maps it to
# DeepseekV3ForCausalLMNextN), its decoder layer one of V3.2's, lightning indexer included (self_attn.indexer.*), and
# with experts: a V3.2 config names each layer's MLP (mlp_layer_types)
DEEPSEEK_V32 = replace(DEEPSEEK, title="DeepSeek-V3.2 (model.layers.{num_hidden_layers}.*)",
                       overrides={**DEEPSEEK.overrides, "mlp_layer_types": ["sparse"]})

# no norm before the lm_head: vLLM's ernie_mtp.py and SGLang's ernie4_eagle.py take the logits of the layer's output
# as it is (transformers' MtpModel puts the target's final norm there; an engine check found vLLM's logits differing
# by 2.9 with it), and feed that output to the next step; its decoder layer is the family's first (dense below
# moe_layer_start_index, as vLLM builds it)
ERNIE = ShippedForm(
    title="ERNIE-4.5 (model.mtp_*.0.*)", counts=("num_nextn_predict_layers", "num_mtp_layers"),
    prefix=lambda text: "model.mtp_",
    parts={"emb_norm.0.weight": "enorm.weight", "hidden_norm.0.weight": "hnorm.weight",
           "linear_proj.0.weight": "eh_proj.weight"},
    block="block.0.", norm_output=False, overrides={POST_NORM: False})

# vLLM's nemotron_h_mtp.py: one step is the blocks of mtp_hybrid_override_pattern (transformers'
# mtp_layers_block_type), mtp.layers.{i} each under the target's own block names (experts one tensor each, q/k/v
# apart: its load_weights fuses them); the first holds enorm, hnorm and eh_proj, the last final_layernorm, whose
# output the next step reads and the target's lm_head reads
NEMOTRON = ShippedForm(
    title="Nemotron-H (mtp.layers.*)", counts=("num_nextn_predict_layers",), prefix=lambda text: "mtp.",
    parts={"layers.0.enorm.weight": "enorm.weight", "layers.0.hnorm.weight": "hnorm.weight",
           "layers.0.eh_proj.weight": "eh_proj.weight", "layers.{last}.final_layernorm.weight": "post_norm.weight"},
    block="layers.", norm_output=True)

# vLLM's mimo_v2_mtp.py and SGLang's mimo_v2_nextn.py: MTP layer i is model.mtp.layers.{i} (the checkpoints ship 3;
# the engines draft every step with layer 0, as the head does); its decoder layer is one of the family's sliding-window
# layers (twice the key/value heads, attention sinks, the sliding layers' RoPE; transformers' attention_sink_bias ->
# sinks renaming applies) with a dense MLP, its pre_mlp_layernorm transformers' post_attention_layernorm;
# final_layernorm's output is what the lm_head and the next step read. Its window is the layer config's
# sliding_window: transformers' and SGLang's (sliding_window_size + 1, the query included); vLLM's flash-attention
# window is sliding_window_size, one key fewer
MIMO = ShippedForm(
    title="MiMo-V2 (model.mtp.layers.*)", counts=(), prefix=lambda text: "model.mtp.layers.0.",
    parts={"enorm.weight": "enorm.weight", "hnorm.weight": "hnorm.weight", "eh_proj.weight": "eh_proj.weight",
           "final_layernorm.weight": "post_norm.weight"},
    block="", renames={"pre_mlp_layernorm.": "post_attention_layernorm."}, norm_output=True,
    overrides={"layer_types": ["sliding_attention"], "mlp_layer_types": ["dense"]})

FORMS: dict[str, ShippedForm] = {
    "qwen3_next": QWEN, "qwen3_5_text": QWEN, "qwen3_5_moe_text": QWEN,
    "deepseek_v3": DEEPSEEK, "glm4_moe": DEEPSEEK, "deepseek_v32": DEEPSEEK_V32,
    "ernie4_5_moe": ERNIE,
    "nemotron_h": NEMOTRON,
    "mimo_v2_flash": MIMO,
}


# every config key a family names its MTP layers with
COUNT_KEYS = ("mtp_num_hidden_layers", "num_nextn_predict_layers", "num_mtp_layers")


def form_of(text: Any) -> ShippedForm | None:
    return FORMS.get(getattr(text, "model_type", ""))


def named_count(text: Any) -> int:
    """How many MTP layers the target's config names, whether or not draftsmith reads its family's form."""
    return max(int(getattr(text, key, 0) or 0) for key in COUNT_KEYS)


def shipped_count(text: Any, folder: str | Path | None = None) -> int:
    """How many MTP layers the target ships in a form draftsmith reads (0: none), as its config says; for a family
    whose configs name none (MiMo-V2), at least the one its checkpoint at `folder` holds under the form's prefix."""
    form = form_of(text)
    if form is None:
        return 0
    if form.counts or not folder or named_count(text):
        return named_count(text)
    return int(holds_prefixed(folder, form.prefix(text)))


def rename(names: Mapping[str, str], name: str) -> str:
    """`name` with the first of `names` (old part -> new part) it holds replaced."""
    return next((name.replace(old, new, 1) for old, new in names.items() if old in name), name)


def checkpoint_files(folder: str | Path) -> list[Path]:
    """The safetensors files of a checkpoint folder (its index's, when sharded)."""
    folder = Path(folder)
    if (folder / INDEX).is_file():
        names = sorted(set(json.loads((folder / INDEX).read_text())["weight_map"].values()))
        return [folder / name for name in names]
    if (folder / SINGLE).is_file():
        return [folder / SINGLE]
    raise DraftsmithError(f"{folder} holds no safetensors checkpoint ({SINGLE} or {INDEX}): draftsmith reads a "
                          f"target's MTP layers from its safetensors files")


def tensor_names(path: Path) -> list[str]:
    """The tensors one safetensors file holds (names read, no tensor)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        return list(handle.keys())


def holds_prefixed(folder: str | Path, prefix: str) -> bool:
    """Whether the checkpoint holds a tensor whose name starts with `prefix` (names read, no tensor)."""
    return any(name.startswith(prefix) for path in checkpoint_files(folder) for name in tensor_names(path))


def read_prefixed(folder: str | Path, prefix: str) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint whose name starts with `prefix`, by the name after it."""
    from safetensors import safe_open

    found: dict[str, torch.Tensor] = {}
    for path in checkpoint_files(folder):
        with safe_open(str(path), framework="pt") as handle:
            for key in handle.keys():
                if key.startswith(prefix):
                    found[key[len(prefix):]] = handle.get_tensor(key)
    return found


def _one_layer_config(layer_config: Any) -> Any:
    """The config of a causal LM of the family one layer deep with a one-row vocabulary (its embeddings cost
    nothing): what the conversions below load and revert."""
    cfg = layer_config.__class__.from_dict({**layer_config.to_dict(), "vocab_size": 1, "pad_token_id": None,
                                            "bos_token_id": None, "eos_token_id": None,
                                            "tie_word_embeddings": False})
    cfg._attn_implementation = "eager"  # every family has it (MiMo-V2 has no SDPA); the conversions run no forward
    return cfg


class _Quiet:
    """transformers' loading report and progress bar (the embeddings, norm and head a one-layer load leaves fresh)
    kept off stderr."""

    def __enter__(self):
        from transformers.utils import logging as hf_logging

        self.logger = logging.getLogger("transformers")
        self.level = self.logger.level
        self.logger.setLevel(logging.ERROR)
        self.bars = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()

    def __exit__(self, *exc):
        from transformers.utils import logging as hf_logging

        self.logger.setLevel(self.level)
        if self.bars:
            hf_logging.enable_progress_bar()


def _layers_prefix(layer_config: Any) -> str:
    """Where the one-layer model keeps what mtp_block holds: its layer 0, or its layers (a step's blocks: {i}.*)."""
    from draftsmith.serve.methods.mtp.blocks import step_blocks

    return "model.layers." if step_blocks(layer_config) else "model.layers.0."


def block_from_checkpoint(tensors: dict[str, torch.Tensor], layer_config: Any) -> dict[str, torch.Tensor]:
    """A decoder layer's tensors (a step's blocks': {i}.*) under their checkpoint names -> the family's decoder layer
    state (MtpBlocks' state; transformers' names); DraftsmithError naming what did not fit."""
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    cfg = _one_layer_config(layer_config)
    prefix = _layers_prefix(layer_config)
    with tempfile.TemporaryDirectory(prefix="draftsmith-mtp-") as tmp:
        cfg.save_pretrained(tmp)
        save_file({f"{prefix}{k}": v.contiguous() for k, v in tensors.items()}, str(Path(tmp) / SINGLE),
                  metadata={"format": "pt"})
        with _Quiet():
            try:
                model, info = AutoModelForCausalLM.from_pretrained(tmp, output_loading_info=True,
                                                                  dtype=next(iter(tensors.values())).dtype)
            except (RuntimeError, ValueError) as err:
                raise DraftsmithError(f"the MTP layer's tensors do not fit a {cfg.model_type!r} layer of this "
                                      f"target's config: {err}") from None
    missing = [k for k in info.get("missing_keys", ()) if ".layers." in k]
    unexpected = [k for k in info.get("unexpected_keys", ()) if ".layers." in k]
    mismatched = [k for k, *_ in info.get("mismatched_keys", ()) if ".layers." in k]
    if missing or unexpected or mismatched:
        raise DraftsmithError(f"the MTP layer's tensors do not fit a {cfg.model_type!r} layer of this target's config: "
                              f"missing {sorted(missing)[:4]}, unexpected {sorted(unexpected)[:4]}, of another shape "
                              f"{sorted(mismatched)[:4]}")
    held = model.model.layers if prefix == "model.layers." else model.model.layers[0]
    return {k: v.detach().clone() for k, v in held.state_dict().items()}


def block_to_checkpoint(block_state: dict[str, torch.Tensor], layer_config: Any) -> dict[str, torch.Tensor]:
    """The family's decoder layer state (MtpBlocks': {i}.*) -> its tensors under the checkpoint's names (as
    save_pretrained writes)."""
    from transformers import AutoModelForCausalLM
    from transformers.core_model_loading import revert_weight_conversion

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(_one_layer_config(layer_config))
    prefix = _layers_prefix(layer_config)
    held = model.model.layers if prefix == "model.layers." else model.model.layers[0]
    held.load_state_dict(block_state, assign=True)
    state = {f"{prefix}{k}": v for k, v in block_state.items()}
    # the base model's own prefix may be reverted too (Nemotron-H's model. -> backbone.): the layers' names after it
    inner = prefix[len("model."):]
    out = {}
    for name, tensor in revert_weight_conversion(model, state).items():
        rest = name.partition(".")[2]
        if not rest.startswith(inner):
            raise DraftsmithError(f"transformers writes a {layer_config.model_type!r} MTP layer's tensor as {name}, "
                                  f"outside {inner!r}: draftsmith cannot place it in the checkpoint")
        out[rest[len(inner):]] = tensor
    return out


def head_state_from_checkpoint(tensors: dict[str, torch.Tensor], form: ShippedForm,
                               layer_config: Any) -> dict[str, torch.Tensor]:
    """The checkpoint's MTP layer 0 (names after the form's prefix) -> the head's state dict."""
    parts = form.names(layer_config)
    missing = sorted(set(parts) - set(tensors))
    if missing:
        raise DraftsmithError(f"the checkpoint's MTP layer lacks {missing} ({form.title})")
    state = {f"layers.0.{ours}": tensors[theirs] for theirs, ours in parts.items()}
    block = {rename(form.renames, k[len(form.block):]): v for k, v in tensors.items()
             if k.startswith(form.block) and k not in parts and k not in form.shared}
    state.update({f"layers.0.mtp_block.{k}": v for k, v in block_from_checkpoint(block, layer_config).items()})
    return state


def head_state_to_checkpoint(state: dict[str, torch.Tensor], form: ShippedForm,
                             layer_config: Any) -> dict[str, torch.Tensor]:
    """The head's state dict -> its tensors under the checkpoint's names (the form's prefix not included)."""
    ours_to_theirs = {ours: theirs for theirs, ours in form.names(layer_config).items()}
    out = {ours_to_theirs[k[len("layers.0."):]]: v for k, v in state.items()
           if k[len("layers.0."):] in ours_to_theirs}
    block = {k[len("layers.0.mtp_block."):]: v for k, v in state.items() if k.startswith("layers.0.mtp_block.")}
    back = {ours: theirs for theirs, ours in form.renames.items()}
    out.update({f"{form.block}{rename(back, k)}": v for k, v in block_to_checkpoint(block, layer_config).items()})
    return out
