"""DFlash in the speculators format (vllm-project/speculators `DFlashSpeculator`), which `vllm serve DIR` reads.

config.json (speculators 0.9 `DFlashSpeculatorConfig`; vLLM's speculators reader `update_dflash`, read in the
0.20 and 0.33 sources): `speculators_model_type: dflash`, `architectures: [DFlashSpeculator]`,
`transformer_layer_config` (the draft layers as a Qwen3 config, `num_hidden_layers` = the draft layers),
`draft_vocab_size`, `target_hidden_size`, `block_size`, `mask_token_id`, `aux_hidden_state_layer_ids` (vLLM's
convention, input of layer i: vLLM takes them as its aux layers), `sample_from_anchor: false` (the last verified
token is the block's first, only the masks draft), `sliding_window_non_causal: true` (vLLM reads its absence the
same way: the block attends both ways), and `speculators_config` (vLLM takes `num_speculative_tokens` = B-1 from the
first proposal method). Tensors as vLLM's own DFlash folder (to_vllm.py): fc in ascending aux order, no lm_head or
embed_tokens (the verifier's).
"""
from __future__ import annotations

import torch

from draftsmith.serve.drafters.head_config import HeadConfig
from draftsmith.serve.export.common import Expect, ExportError, FormatSpec, TargetFacts
from draftsmith.serve.export import speculators as speculators_format
from draftsmith.serve.export.engines import Support
from draftsmith.serve.export.layer_ids import aux_layer_ids_for, from_engine_layer_ids
from draftsmith.serve.export.method_export import FormatExport
from draftsmith.serve.methods.dflash import to_vllm
from draftsmith.serve.methods.eagle3.to_speculators import SPECULATORS_VERSION, check_extra

NAME = "speculators"
ARCHITECTURES = ("DFlashSpeculator",)
MODEL_TYPE = "dflash"


def build(state: dict[str, torch.Tensor], config: HeadConfig, facts: TargetFacts) -> tuple[dict, dict]:
    _, tensors = to_vllm.build(state, config, facts)
    layer = to_vllm.layer_fields(config)
    body = {
        "architectures": list(ARCHITECTURES), "speculators_model_type": MODEL_TYPE,
        "speculators_version": SPECULATORS_VERSION, "transformer_layer_config": layer,
        "draft_vocab_size": config.vocab_size, "target_hidden_size": config.hidden_size,
        "block_size": config.block_size, "mask_token_id": config.mask_token_id,
        "aux_hidden_state_layer_ids": aux_layer_ids_for(config, NAME, facts.num_layers),
        "sample_from_anchor": False, "sliding_window_non_causal": True,
        "speculators_config": speculators_format.speculators_config(MODEL_TYPE, config.block_size - 1, facts),
    }
    return body, tensors


def expected(config: HeadConfig, facts: TargetFacts) -> FormatSpec:
    spec = to_vllm.expected(config, facts)
    ids = aux_layer_ids_for(config, NAME, facts.num_layers)
    fields = {f"transformer_layer_config.{key}": Expect(value) for key, value in to_vllm.layer_fields(config).items()
              if key != "rope_scaling"}
    fields.update({
        "architectures": Expect(list(ARCHITECTURES)),
        "speculators_model_type": Expect(MODEL_TYPE, "vLLM picks its speculators reader by this key"),
        "draft_vocab_size": Expect(config.vocab_size, "DFlash drafts over the target's vocabulary"),
        "block_size": Expect(config.block_size), "mask_token_id": Expect(config.mask_token_id),
        "aux_hidden_state_layer_ids": Expect(ids, "vLLM convention: id i = input of layer i"),
        "sample_from_anchor": Expect(False, "the block's first token is the last verified one"),
        "sliding_window_non_causal": Expect(True, "vLLM: the block attends both ways"),
        **speculators_format.speculators_config_fields(MODEL_TYPE, config.block_size - 1, facts),
    })
    return FormatSpec(NAME, "dflash", fields, spec.tensors, engine_layer_ids=ids)


def read(config: dict, tensors: dict, *, num_layers: int, where: str) -> tuple[HeadConfig, dict]:
    """The head vLLM builds from the folder: update_dflash turns it into its own DFlash config."""
    layer = speculators_format.layer_config(config, where=where, family="Qwen3")
    if config.get("sample_from_anchor"):
        raise ExportError(f"{where}: sample_from_anchor is true (the anchor drafts too); draftsmith's DFlash "
                          f"drafts from the mask slots alone")
    if config.get("mask_token_id") is None or not config.get("aux_hidden_state_layer_ids"):
        raise ExportError(f"{where}: mask_token_id and aux_hidden_state_layer_ids are required (vLLM's "
                          f"update_dflash reads both)")
    if config.get("sliding_window_non_causal") is False:
        raise ExportError(f"{where}: sliding_window_non_causal is false: vLLM makes the block causal")
    aux = from_engine_layer_ids(config["aux_hidden_state_layer_ids"], NAME, num_layers=num_layers)
    native = {**layer, "block_size": config.get("block_size"),
              "dflash_config": {"mask_token_id": config["mask_token_id"], "target_layer_ids": sorted(aux)}}
    return to_vllm.read(native, tensors, num_layers=num_layers, where=where, fmt=NAME)


FORM = FormatExport(architectures=ARCHITECTURES, serve_as=MODEL_TYPE, check=to_vllm.check,
                    support=lambda config: Support("vLLM", to_vllm.FIRST, why="vLLM reads no DFlash speculators "
                                                   "folder before 0.20", fix="Use vLLM 0.20 or newer."),
                    build=build, expected=expected, read=read, full_vocab_only=True,
                    claims=lambda config: config.get("speculators_model_type") == MODEL_TYPE,
                    check_extra=check_extra)
