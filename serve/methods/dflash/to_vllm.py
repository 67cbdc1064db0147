"""DFlash in vLLM's and SGLang's own format (`DFlashDraftModel`: vLLM 0.20+ qwen3_dflash.py's DFlashQwen3ForCausalLM,
SGLang 0.5.11+ models/dflash.py): one folder both engines read.

What vLLM reads (qwen3_dflash.py and the aux-layer lookup, read in the 0.20 and 0.34 sources): a Qwen3 config
(`model_type` qwen3, the layer's sizes, `num_hidden_layers` = the draft layers, rope), `block_size`,
`dflash_config.mask_token_id` (the drafted slots' token), and the aux layers from `eagle_aux_hidden_state_layer_ids`
in vLLM's convention (input of layer i), which every release reads first; `dflash_config.target_layer_ids` (outputs
of layers, the DFlash checkpoints' field: 0.34 adds 1 to it, 0.20 read it as written, vLLM #40727) is written too,
and 0.20 sizes fc by its length. The target concatenates aux states in ascending layer order, so fc's column blocks
are permuted to it (as EAGLE-3's). Tensors keep their names (`fc`, `hidden_norm`, `layers.{i}.self_attn.{q,k,v,o}_proj`,
`q_norm`, `k_norm`, `input_layernorm`, `post_attention_layernorm`, `mlp.*`, `norm`); the embedding and lm_head are
the target's, shared by the proposer. The block attends both ways (no `layer_types`, no `causal`).

SGLang (speculative/dflash_utils.py parse_dflash_draft_config, 0.5.23's source) reads `block_size` and
`dflash_config.{mask_token_id, target_layer_ids}` and captures the outputs of those layers (`val + 1` inputs,
llama.py set_dflash_layers_to_capture), in ascending order: the same folder.
"""
from __future__ import annotations

import torch

from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.drafters.head_config import HeadConfig
from draftsmith.serve.export.common import ABSENT, Expect, ExportError, FormatSpec, TargetFacts, get_field
from draftsmith.serve.export.engines import Support
from draftsmith.serve.export.layer_ids import aux_layer_ids_for, from_engine_layer_ids
from draftsmith.serve.export.llama_config import rope_fields
from draftsmith.serve.export.method_export import FormatExport
from draftsmith.serve.methods.eagle3.export import fc_in_engine_order

NAME = "vllm"
ARCHITECTURES = ("DFlashDraftModel",)
FIRST = (0, 20)  # qwen3_dflash.py arrives in vLLM 0.20
_LAYER_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
               "head_dim", "hidden_act", "max_position_embeddings", "rms_norm_eps")


def check(config: HeadConfig) -> None:
    layer = config.layer_config
    for flag in ("attention_bias", "mlp_bias"):
        if layer.get(flag):
            raise DraftsmithError(f"--format vllm dflash: {flag}=true in the drafter's layers; vLLM's DFlash layers "
                                  f"read attention_bias only and no mlp bias: retrain without it")
    if layer.get("hidden_act", "silu") != "silu":
        raise DraftsmithError(f"--format vllm dflash: the drafter's MLP uses {layer['hidden_act']!r}; vLLM's "
                              f"Qwen3 DFlash layers run silu")


def layer_fields(config: HeadConfig) -> dict:
    """The draft layers as the Qwen3 config both engines build them from."""
    layer = config.layer_config
    out = {key: layer[key] for key in _LAYER_KEYS if key in layer}
    out["head_dim"] = out.get("head_dim") or layer["hidden_size"] // layer["num_attention_heads"]
    out.update(model_type="qwen3", num_hidden_layers=int(layer["num_hidden_layers"]), attention_bias=False,
               tie_word_embeddings=False, **rope_fields(layer))
    return out


def build(state: dict[str, torch.Tensor], config: HeadConfig, facts: TargetFacts) -> tuple[dict, dict]:
    aux = list(config.aux_layer_ids)
    body = {"architectures": list(ARCHITECTURES), **layer_fields(config), "draft_vocab_size": config.vocab_size,
            "target_hidden_size": config.hidden_size, "block_size": config.block_size,
            "dflash_config": {"mask_token_id": config.mask_token_id, "target_layer_ids": sorted(aux)},
            "eagle_aux_hidden_state_layer_ids": aux_layer_ids_for(config, NAME, facts.num_layers)}
    tensors = {name: tensor.detach().to("cpu").contiguous() for name, tensor in state.items()}
    tensors["fc.weight"] = fc_in_engine_order(tensors["fc.weight"], aux).contiguous()
    return body, tensors


def expected(config: HeadConfig, facts: TargetFacts, *, fmt: str = NAME) -> FormatSpec:
    fields = {key: Expect(value) for key, value in layer_fields(config).items() if key != "rope_scaling"}
    ids = aux_layer_ids_for(config, NAME, facts.num_layers)
    fields.update({
        "architectures": Expect(list(ARCHITECTURES), "vLLM's registry name of the DFlash draft model"),
        "model_type": Expect("qwen3", "vLLM builds DFlash layers from a Qwen3 config"),
        "block_size": Expect(config.block_size, "the block the drafter was trained on"),
        "dflash_config.mask_token_id": Expect(config.mask_token_id, "the token the drafted slots are embedded as"),
        "dflash_config.target_layer_ids": Expect(sorted(config.aux_layer_ids), "outputs of decoder layers"),
        "eagle_aux_hidden_state_layer_ids": Expect(ids, "vLLM convention: id i = input of layer i"),
        "draft_vocab_size": Expect(config.vocab_size, "DFlash drafts over the target's vocabulary"),
        "layer_types": Expect(ABSENT, "sliding or causal draft layers; draftsmith's attend both ways"),
        "dflash_config.causal": Expect(ABSENT, "causal blocks; draftsmith's attend both ways"),
    })
    h, n = config.hidden_size, len(config.aux_layer_ids)
    tensors = {"fc.weight": ((h, n * h), None), "hidden_norm.weight": ((h,), None), "norm.weight": ((h,), None)}
    layer = config.layer_config
    heads, kv = int(layer["num_attention_heads"]), int(layer.get("num_key_value_heads") or layer["num_attention_heads"])
    hd = int(layer.get("head_dim") or h // heads)
    inter = int(layer["intermediate_size"])
    for i in range(int(layer["num_hidden_layers"])):
        p = f"layers.{i}."
        tensors.update({p + "self_attn.q_proj.weight": ((heads * hd, h), None),
                        p + "self_attn.k_proj.weight": ((kv * hd, h), None),
                        p + "self_attn.v_proj.weight": ((kv * hd, h), None),
                        p + "self_attn.o_proj.weight": ((h, heads * hd), None),
                        p + "self_attn.q_norm.weight": ((hd,), None), p + "self_attn.k_norm.weight": ((hd,), None),
                        p + "input_layernorm.weight": ((h,), None), p + "post_attention_layernorm.weight": ((h,), None),
                        p + "mlp.gate_proj.weight": ((inter, h), None), p + "mlp.up_proj.weight": ((inter, h), None),
                        p + "mlp.down_proj.weight": ((h, inter), None)})
    # SGLang's ids are dflash_config.target_layer_ids, checked above
    return FormatSpec(fmt, "dflash", fields, tensors, engine_layer_ids=ids if fmt == NAME else [])


def claims(config: dict) -> bool:
    return any(a in ARCHITECTURES for a in config.get("architectures") or [])


def read(config: dict, tensors: dict, *, num_layers: int, where: str, fmt: str = NAME) -> tuple[HeadConfig, dict]:
    """The head `fmt`'s engine builds: vLLM takes the aux layers from eagle_aux_hidden_state_layer_ids first,
    SGLang from dflash_config.target_layer_ids alone."""
    dflash = config.get("dflash_config") or {}
    if get_field(config, "layer_types", None) or dflash.get("causal") or dflash.get("use_swa"):
        raise ExportError(f"{where}: causal or sliding-window draft layers (layer_types / dflash_config.causal / "
                          f"use_swa); draftsmith's DFlash layers attend both ways over the whole context")
    if dflash.get("mask_token_id") is None:
        raise ExportError(f"{where}: dflash_config.mask_token_id is missing; vLLM cannot embed the drafted slots")
    # SGLang: dflash_config.target_layer_ids alone (speculators' reader passes its ids there too)
    engine_ids = config.get("eagle_aux_hidden_state_layer_ids") if fmt == NAME else None
    aux = sorted(from_engine_layer_ids(engine_ids, NAME, num_layers=num_layers) if engine_ids else
                 [int(i) for i in dflash.get("target_layer_ids") or []])  # 0.34: outputs of layers
    if not aux:
        raise ExportError(f"{where}: no aux layers (eagle_aux_hidden_state_layer_ids or dflash_config."
                          f"target_layer_ids)")
    layer = {key: config[key] for key in _LAYER_KEYS if key in config}
    layer.update(model_type="llama", num_hidden_layers=int(config["num_hidden_layers"]),
                 rope_parameters=rope_fields(config)["rope_parameters"])
    block = int(config.get("block_size") or 0)
    vocab = int(config["vocab_size"])
    head_config = HeadConfig(method="dflash", model_type="llama", hidden_size=int(config["hidden_size"]),
                             vocab_size=vocab, draft_vocab_size=vocab, num_speculative_tokens=block - 1,
                             aux_layer_ids=aux, block_size=block, mask_token_id=int(dflash["mask_token_id"]),
                             layer_config=layer)
    return head_config, dict(tensors)


SGLANG_FIRST = (0, 5, 11)  # models/dflash.py and the target's set_dflash_layers_to_capture arrive in 0.5.11

SGLANG_FORM = FormatExport(
    architectures=ARCHITECTURES, serve_as="DFLASH", check=check,
    support=lambda config: Support("SGLang", SGLANG_FIRST, why="SGLang has no DFlash draft model before 0.5.11",
                                   fix="Use SGLang 0.5.11 or newer."),
    build=build, expected=lambda config, facts: expected(config, facts, fmt="sglang"), claims=claims,
    read=lambda config, tensors, *, num_layers, where: read(config, tensors, num_layers=num_layers, where=where,
                                                           fmt="sglang"),
    full_vocab_only=True, serve_options={"num_steps": 1},  # one forward drafts the block
    notes=lambda config, facts: ["SGLang versions: DFlashDraftModel from SGLang 0.5.11 (read in the 0.5.23 source; "
                                 "SGLang cannot run on this CPU, so its loader was not run)."])

FORM = FormatExport(architectures=ARCHITECTURES, serve_as="dflash", check=check,
                    support=lambda config: Support("vLLM", FIRST, why="vLLM has no DFlash draft model before 0.20",
                                                   fix="Use vLLM 0.20 or newer."),
                    build=build, expected=expected, claims=claims, read=read, full_vocab_only=True,
                    notes=lambda config, facts: ["vLLM versions: DFlashDraftModel from vLLM 0.20 (read in the 0.20 "
                                                 "and 0.34 sources)."])
