"""Readers of exported folders: rebuild a draftsmith Drafter the way each engine would read the folder.

Each reader interprets config.json and the tensors with the ENGINE's rules and defaults (aux-layer
convention, architectures, flags and their defaults, tensor names it loads, tensors it ignores), never with
the draftsmith provenance entry, so a folder the engine would misread gives a drafter that drafts differently
(or a reader error naming the field). The target hashes recorded by draftsmith, when present, still refuse
another target.
"""
from __future__ import annotations

from pathlib import Path

import torch

from serve.drafters.base import FINAL, Drafter
from serve.drafters.folder import build_head, make_drafter
from serve.drafters.heads_common import HeadConfig, check_target_identity, text_config_of
from serve.export.common import ABSENT, ExportError, lookup, read_config, read_tensors
from serve.export.layer_ids import engine_default_layer_ids, from_engine_layer_ids
from serve.export.provenance import target_identity

FORMATS = ("vllm", "sglang", "speculators")
_LAYER_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
               "head_dim", "hidden_act", "max_position_embeddings", "rms_norm_eps", "attention_bias", "mlp_bias",
               "rope_theta", "rope_scaling", "bos_token_id", "eos_token_id", "pad_token_id")


def read_export(path: str | Path, target, *, fmt: str, attn_implementation: str = "sdpa") -> Drafter:
    """The Drafter `fmt`'s engine would build from the folder `path`, serving `target`."""
    head = read_head(path, target, fmt=fmt, attn_implementation=attn_implementation)
    return make_drafter(head, target)


def read_head(path: str | Path, target, *, fmt: str, attn_implementation: str = "sdpa") -> torch.nn.Module:
    if fmt not in FORMATS:
        raise ExportError(f"unknown export format {fmt!r}; choose one of {', '.join(FORMATS)}")
    config, tensors = read_config(path), read_tensors(path)
    where = f"{fmt} export {path}"
    num_layers = text_config_of(target.config).num_hidden_layers
    if fmt == "vllm":
        head_config, state = _vllm(config, tensors, num_layers, where)
    elif fmt == "sglang":
        head_config, state = _sglang(config, tensors, num_layers, where)
    else:
        head_config, state = _speculators(config, tensors, num_layers, where)
    for key, value in target_identity(config).items():
        setattr(head_config, key, value)
    if head_config.layer_config:
        head_config.layer_config["_attn_implementation"] = attn_implementation
    check_target_identity(head_config, target)
    head = build_head(head_config)
    missing, _ = head.load_state_dict(state, strict=False)  # names the engine does not load are ignored, as there
    if missing:
        raise ExportError(f"{where}: {head_config.method} needs tensor {sorted(missing)[0]!r}, which the engine "
                          f"would not find (it would keep a random initialization)")
    return head


# ----------------------------------------------------------------------------------------------- helpers

def _layer_config(source: dict) -> dict:
    """The Llama layer the engine builds from a config dict (its own keys only)."""
    layer = {k: source[k] for k in _LAYER_KEYS if k in source}
    layer.update(model_type="llama", num_hidden_layers=1)
    return layer


def _get(config: dict, key: str, default):
    value = lookup(config, key)
    return default if value is ABSENT or value is None else value


def _eagle_config(method: str, layer_source: dict, **fields) -> HeadConfig:
    layer = _layer_config(layer_source)
    vocab = int(layer["vocab_size"])
    return HeadConfig(method=method, model_type="llama", hidden_size=int(layer["hidden_size"]), vocab_size=vocab,
                      draft_vocab_size=int(fields.pop("draft_vocab_size", vocab)), layer_config=layer, **fields)


def _rename(tensors: dict, old: str, new: str) -> dict:
    return {(new + k[len(old):] if k.startswith(old) else k): v for k, v in tensors.items()}


def _vocab_maps(tensors: dict, vocab: int, draft_vocab: int, *, where: str) -> dict:
    """d2t as the engines use it (target = draft + d2t); absent means identity offsets; t2d rebuilt from d2t."""
    d2t = tensors.get("d2t")
    if d2t is None:
        if draft_vocab != vocab:
            raise ExportError(f"{where}: tensor 'd2t' is missing with draft_vocab_size {draft_vocab} < vocab_size "
                              f"{vocab}: draft ids would be read as target ids")
        d2t = torch.zeros(draft_vocab, dtype=torch.long)
    d2t = d2t.to(torch.long)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[torch.arange(d2t.numel()) + d2t] = True
    return {"d2t": d2t, "t2d": t2d}


def _eagle3_common(config: dict, tensors: dict, *, where: str, engine: str, num_layers: int, ids_key: str,
                   layer_source: dict, norm_before_residual_default: bool) -> tuple[HeadConfig, dict]:
    if _get(config, "norm_before_residual", norm_before_residual_default):
        raise ExportError(f"{where}: norm_before_residual is true ({engine} then adds the NORMED fused state as the "
                          f"residual); draftsmith heads add the un-normed one: expected false")
    for flag in ("norm_before_fc", "fc_norm", "norm_output"):
        if _get(config, flag, False):
            raise ExportError(f"{where}: {flag} is true; the drafter has no such norm: expected false")
    if not _get(config, "eagle_config.use_aux_hidden_state", True):
        raise ExportError(f"{where}: eagle_config.use_aux_hidden_state is false; expected true (fc over aux layers)")
    raw = _get(config, ids_key, None) or engine_default_layer_ids(engine, num_layers=num_layers)
    # Engines concatenate aux states in ascending layer order, whatever order the config lists.
    aux = sorted(from_engine_layer_ids(list(raw), engine, num_layers=num_layers))
    layer_vocab = int(layer_source["vocab_size"])
    draft_vocab = int(_get(config, "draft_vocab_size", layer_vocab))
    target_hidden = int(_get(config, "target_hidden_size", layer_source["hidden_size"]))
    if target_hidden != int(layer_source["hidden_size"]):
        raise ExportError(f"{where}: target_hidden_size {target_hidden} != hidden_size {layer_source['hidden_size']}; "
                          f"draftsmith heads share the target's width")
    head_config = _eagle_config("eagle3", layer_source, draft_vocab_size=draft_vocab, aux_layer_ids=aux,
                                input_layernorm=True, hidden_norm=True)
    state = {k: v for k, v in tensors.items() if k not in ("d2t", "t2d")}
    state.update(_vocab_maps(tensors, layer_vocab, draft_vocab, where=where))
    return head_config, state


# ------------------------------------------------------------------------------------------------ engines

def _vllm(config: dict, tensors: dict, num_layers: int, where: str) -> tuple[HeadConfig, dict]:
    archs = list(config.get("architectures") or [])
    if "MedusaModel" in archs or config.get("model_type") == "medusa":
        return _vllm_medusa(config, tensors, where)
    if any("Eagle3" in a for a in archs):
        # llama_eagle3.load_weights: "midlayer." -> "layers.0."; both spellings load.
        tensors = _rename(tensors, "layers.0.", "midlayer.")
        return _eagle3_common(config, tensors, where=where, engine="vllm", num_layers=num_layers,
                              ids_key="eagle_aux_hidden_state_layer_ids", layer_source=config,
                              norm_before_residual_default=False)
    if any(a.startswith("Eagle") for a in archs) or archs == ["LlamaForCausalLM"]:
        if _get(config, "add_para_norm", False):
            raise ExportError(f"{where}: add_para_norm is true (HASS norms); expected false")
        # vLLM's EAGLE-1 fc has no bias: an fc.bias tensor would be ignored (skipped by the loader).
        state = {k: v for k, v in tensors.items() if k != "fc.bias" and "input_layernorm" not in k}
        return _eagle_config("eagle1", config, aux_layer_ids=[FINAL], input_layernorm=False,
                             fc_bias=False), state
    raise ExportError(f"{where}: architectures {archs} is no vLLM EAGLE/Medusa draft model; expected one of "
                      f"EagleLlamaForCausalLM, LlamaForCausalLMEagle3, Eagle3LlamaForCausalLM, MedusaModel")


def _vllm_medusa(config: dict, tensors: dict, where: str) -> tuple[HeadConfig, dict]:
    # MedusaConfig.from_pretrained renames every key holding "num" + "heads"/"layers".
    renamed = dict(config)
    for key in list(config):
        if "num" in key and "heads" in key:
            renamed["num_heads"] = renamed.pop(key)
        elif "num" in key and "layers" in key:
            renamed["num_hidden_layers"] = renamed.pop(key)
    vocab = int(renamed["vocab_size"])
    draft_vocab = int(_get(renamed, "truncated_vocab_size", vocab))
    if _get(renamed, "original_lm_head", False):
        raise ExportError(f"{where}: original_lm_head is true (one shared lm_head); expected false")
    head_config = HeadConfig(method="medusa", model_type="llama", hidden_size=int(renamed["hidden_size"]),
                             vocab_size=vocab, draft_vocab_size=draft_vocab,
                             num_speculative_tokens=int(_get(renamed, "num_heads", 5)), aux_layer_ids=[FINAL],
                             medusa_num_layers=int(_get(renamed, "num_hidden_layers", 1)))
    state = {k: v for k, v in tensors.items() if k.startswith(("blocks.", "lm_heads."))}
    if not _get(renamed, "medusa_fc_bias", False):
        # vLLM builds bias-free ResBlocks and drops the stored biases: exactly a zero bias.
        state = {k: (torch.zeros_like(v) if k.endswith(".bias") else v) for k, v in state.items()}
    if draft_vocab < vocab:
        if "token_map" not in tensors:
            raise ExportError(f"{where}: truncated_vocab_size {draft_vocab} < vocab_size {vocab} needs tensor "
                              f"'token_map'; vLLM asserts it is present")
        token_map = tensors["token_map"].to(torch.long)
        state.update(_vocab_maps({"d2t": token_map - torch.arange(token_map.numel())}, vocab, draft_vocab,
                                 where=where))
    else:
        state.update(_vocab_maps({}, vocab, vocab, where=where))
    return head_config, state


def _sglang(config: dict, tensors: dict, num_layers: int, where: str) -> tuple[HeadConfig, dict]:
    archs = list(config.get("architectures") or [])
    if "LlamaForCausalLMEagle3" in archs:
        if _get(config, "tie_word_embeddings", True):
            raise ExportError(f"{where}: tie_word_embeddings is true or missing: SGLang would use the embedding "
                              f"matrix as the draft lm_head; expected false")
        if _get(config, "draft_vocab_size", None) is None:
            raise ExportError(f"{where}: draft_vocab_size is missing: SGLang would load the target's lm_head instead "
                              f"of the drafter's; expected the drafter's vocabulary size")
        if _get(config, "bias", False):
            raise ExportError(f"{where}: bias is true (fc with bias); draftsmith EAGLE-3 heads have none")
        # Only "midlayer.*" names find SGLang parameters; anything else is skipped.
        tensors = {k: v for k, v in tensors.items() if not k.startswith("layers.")}
        return _eagle3_common(config, tensors, where=where, engine="sglang", num_layers=num_layers,
                              ids_key="eagle_config.eagle_aux_hidden_state_layer_ids", layer_source=config,
                              norm_before_residual_default=False)
    if "LlamaForCausalLMEagle" in archs:
        # SGLang's EAGLE-1 fc is nn.Linear(2h, h) with a bias, always; layer 0 skips input_layernorm.
        state = {k: v for k, v in tensors.items() if "input_layernorm" not in k}
        return _eagle_config("eagle1", config, aux_layer_ids=[FINAL], input_layernorm=False,
                             fc_bias=True), state
    raise ExportError(f"{where}: architectures {archs} is no SGLang EAGLE draft model; expected "
                      f"LlamaForCausalLMEagle or LlamaForCausalLMEagle3")


def _speculators(config: dict, tensors: dict, num_layers: int, where: str) -> tuple[HeadConfig, dict]:
    kind = config.get("speculators_model_type")
    if kind != "eagle3":
        raise ExportError(f"{where}: speculators_model_type is {kind!r}; expected 'eagle3' (the only EAGLE type "
                          f"vLLM's speculators reader registers)")
    layer_source = config.get("transformer_layer_config")
    if not isinstance(layer_source, dict):
        raise ExportError(f"{where}: transformer_layer_config is missing; expected the draft layer's Llama config")
    tensors = _rename(tensors, "layers.0.", "midlayer.")
    # vllm/transformers_utils/configs/speculators/algos.py: norm_before_residual defaults to True.
    return _eagle3_common(config, tensors, where=where, engine="speculators", num_layers=num_layers,
                          ids_key="eagle_aux_hidden_state_layer_ids", layer_source=layer_source,
                          norm_before_residual_default=True)
