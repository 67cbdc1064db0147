"""vLLM's own draft formats: EAGLE-1 (`EagleLlamaForCausalLM`), EAGLE-3 (`LlamaForCausalLMEagle3`), Medusa.

What vLLM reads (vllm/model_executor/models/llama_eagle.py, llama_eagle3.py, medusa.py,
vllm/transformers_utils/configs/{eagle,medusa}.py, the v1 EAGLE proposer):
- EAGLE-1: a Llama config; `fc` (h, 2h) built WITHOUT bias (v1 llama_eagle.py; PRs to read `bias` from the
  config, vllm-project/vllm#22323 and #22558, were closed; a config `bias` turns on attention biases instead); `layers.0.*` with input_layernorm replaced by an
  identity; embeddings and lm_head shared from the target. Architecture `Eagle{Arch}` (EAGLEConfig adds the
  prefix to a plain `LlamaForCausalLM`).
- EAGLE-3: `fc` (h, 3 * target_hidden_size), `midlayer.*` renamed to `layers.0.*` on load, q/k/v reading 2h,
  `hidden_norm`, `norm`, own `lm_head` (draft_vocab_size, h), `d2t` loaded as draft_id_to_target_id
  (target = draft + d2t), `t2d` skipped; `norm_before_residual` (default false here); aux ids from the top-level
  `eagle_aux_hidden_state_layer_ids` in vLLM's convention (serve/export/layer_ids.py); embed_tokens shared
  from the target when the folder has none. From vLLM 0.30 a full draft vocabulary has NO
  draft_id_to_target_id parameter and a `d2t` tensor fails the load; before, a missing d2t stays all zeros
  (identity): so d2t is written for a reduced vocabulary only.
- Medusa (MedusaConfig, vLLM 0.15-0.32; vLLM 0.33 removed medusa.py and the "medusa" method): `num_heads`,
  `num_hidden_layers` (ResBlocks per head), `medusa_fc_bias` (default false: biases would be dropped
  silently), `original_lm_head` (false: one lm_head per head). Each head's lm_head is built with `vocab_size`
  rows whatever `truncated_vocab_size` says, so a reduced-vocabulary head (Vd, h) fails the loader's shape
  check: only full-vocabulary Medusa heads load. Every top-level key holding "num" and "heads"/"layers" is
  renamed to num_heads/num_hidden_layers by MedusaConfig.from_pretrained.
"""
from __future__ import annotations

import json

import torch

from draftsmith.serve.drafters.head_config import HeadConfig
from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.export.common import ABSENT, Expect, ExportError, FormatSpec, TargetFacts, get_field
from draftsmith.serve.export.eagle import (check_eagle_exportable, eagle_tensors, expected_eagle_tensors,
                                           expected_llama_fields, feature_norm_fields, feature_norm_support,
                                           feature_norms, read_eagle1, read_eagle3, read_vocab_maps, rename_prefix)
from draftsmith.serve.export.engines import Support
from draftsmith.serve.export.layer_ids import aux_layer_ids_for
from draftsmith.serve.export.llama_config import llama_layer_config

NAME = "vllm"
ENGINE = "vLLM"
METHODS = ("eagle1", "eagle3", "medusa")
ARCHITECTURES = {"eagle1": ["EagleLlamaForCausalLM"], "eagle3": ["LlamaForCausalLMEagle3"], "medusa": ["MedusaModel"]}
METHOD_FLAG = {"eagle1": "eagle", "eagle3": "eagle3", "medusa": "medusa"}  # speculative_config "method"
MEDUSA_FULL_VOCAB = ("vLLM's Medusa needs a full-vocabulary drafter (it builds every head's lm_head with the "
                     "target's {vocab} rows; this drafter's heads have {draft} and fail its shape check): retrain "
                     "with model.draft_vocab_size=0, or export an EAGLE drafter")


def support(config: HeadConfig) -> Support:
    """The vLLM releases that load this drafter's export (checked: every release's source 0.15-0.33)."""
    if config.method == "medusa":
        return Support(ENGINE, (0, 15), (0, 32), why="vLLM 0.33 removed Medusa (no medusa.py, no 'medusa' method)",
                       fix="Serve it with vLLM 0.32, or train and export an EAGLE-3 drafter for newer vLLM.")
    return feature_norm_support(config, NAME, ENGINE) or Support(ENGINE, (0, 15))


def check_exportable(config: HeadConfig) -> None:
    """Refuse, before anything is written, a drafter that no vLLM release can load."""
    if config.method not in METHODS:
        raise DraftsmithError(f"--format vllm cannot export method {config.method!r}")
    if config.method == "medusa":
        if config.uses_draft_vocab:
            raise DraftsmithError(MEDUSA_FULL_VOCAB.format(vocab=config.vocab_size, draft=config.draft_vocab_size))
        return
    check_eagle_exportable(config, NAME)
    if config.method == "eagle1" and config.fc_bias:
        raise DraftsmithError("--format vllm eagle1: vLLM's EagleLlamaForCausalLM builds fc without a bias "
                              "(llama_eagle.py), but this drafter was trained with fc_bias=true; export --format "
                              "sglang, or retrain with model.fc_bias=false")


def build(state: dict[str, torch.Tensor], config: HeadConfig, facts: TargetFacts) -> tuple[dict, dict]:
    """(config.json body without provenance, tensors) for the native head's `state`."""
    check_exportable(config)
    if config.method == "medusa":
        return _medusa(state, config)
    body = {"architectures": ARCHITECTURES[config.method], **llama_layer_config(config)}
    if config.method == "eagle1":
        body["add_para_norm"] = False  # HASS extra norms off
    else:
        body.update(draft_vocab_size=config.draft_vocab_size, target_hidden_size=config.hidden_size,
                    norm_before_residual=False, **feature_norms(config),
                    eagle_aux_hidden_state_layer_ids=aux_layer_ids_for(config, NAME, facts.num_layers))
    tensors = eagle_tensors(state, config, layer_prefix="midlayer" if config.method == "eagle3" else "layers.0")
    return body, tensors


def _medusa(state: dict[str, torch.Tensor], config: HeadConfig) -> tuple[dict, dict]:
    body = {"model_type": "medusa", "architectures": ARCHITECTURES["medusa"], "hidden_size": config.hidden_size,
            "vocab_size": config.vocab_size, "num_heads": config.num_speculative_tokens,
            "num_hidden_layers": config.medusa_num_layers, "truncated_vocab_size": config.vocab_size,
            "medusa_fc_bias": True, "original_lm_head": False}
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in state.items() if k not in ("d2t", "t2d")}
    return body, tensors


def expected(config: HeadConfig, facts: TargetFacts) -> FormatSpec:
    """What vLLM reads for this drafter, from the native config and the target's config alone."""
    text = facts.text
    if config.method == "medusa":
        return _expected_medusa(config, text)
    fields = expected_llama_fields(text)
    fields["architectures"] = Expect(ARCHITECTURES[config.method], "vLLM's registry name of the draft model",
                                     also=(["Eagle3LlamaForCausalLM"],) if config.method == "eagle3" else ())
    ids = None
    if config.method == "eagle1":
        fields["add_para_norm"] = Expect(False, "HASS extra norms the drafter does not have", also=(ABSENT,))
    else:
        ids = aux_layer_ids_for(config, NAME, facts.num_layers)
        fields.update({
            "draft_vocab_size": Expect(config.draft_vocab_size, "rows of the draft lm_head"),
            "target_hidden_size": Expect(int(text["hidden_size"]), "fc reads 3 x target_hidden_size"),
            "norm_before_residual": Expect(False, "the drafter adds the un-normed fused state as residual"),
            **feature_norm_fields(config),
            "eagle_aux_hidden_state_layer_ids": Expect(ids, "vLLM convention: id i = input of layer i"),
            "eagle_config.use_aux_hidden_state": Expect(True, "fc over the aux layers", also=(ABSENT,)),
        })
    tensors = expected_eagle_tensors(config, text, layer_prefix="midlayer" if config.method == "eagle3" else "layers.0",
                                     fc_bias=False)
    return FormatSpec(NAME, config.method, fields, tensors, engine_layer_ids=ids or [])


def _expected_medusa(config: HeadConfig, text: dict) -> FormatSpec:
    h, vocab = int(text["hidden_size"]), int(text["vocab_size"])
    if config.uses_draft_vocab:
        raise ExportError(MEDUSA_FULL_VOCAB.format(vocab=vocab, draft=config.draft_vocab_size))
    heads, layers = config.num_speculative_tokens, config.medusa_num_layers
    fields = {
        "model_type": Expect("medusa"), "architectures": Expect(["MedusaModel"]),
        "hidden_size": Expect(h), "vocab_size": Expect(vocab), "num_heads": Expect(heads),
        "num_hidden_layers": Expect(layers, "ResBlocks per head"),
        "truncated_vocab_size": Expect(vocab, "vLLM builds every lm_head with vocab_size rows", also=(ABSENT,)),
        "medusa_fc_bias": Expect(True, "without it vLLM builds bias-free ResBlocks and drops the trained biases"),
        "original_lm_head": Expect(False, "one lm_head per head", also=(ABSENT,)),
    }
    tensors: dict = {}
    for i in range(heads):
        for j in range(layers):
            tensors[f"blocks.{i}.layers.{j}.weight"] = ((h, h), None)
            tensors[f"blocks.{i}.layers.{j}.bias"] = ((h,), None)
        tensors[f"lm_heads.{i}.weight"] = ((vocab, h), None)
    return FormatSpec(NAME, "medusa", fields, tensors)


def check_extra(config: dict) -> list[str]:
    """Problems a FormatSpec cannot express: Medusa keys MedusaConfig would rename onto num_heads/num_hidden_layers."""
    if config.get("model_type") != "medusa":
        return []
    clobber = [k for k in config if "num" in k and (("heads" in k and k != "num_heads")
                                                     or ("layers" in k and k != "num_hidden_layers"))]
    return [f"config field {k!r} would be renamed by vLLM's MedusaConfig onto num_heads/num_hidden_layers; expected "
            f"absent" for k in clobber]


# ------------------------------------------------------------------------------------------------ reader

def read(config: dict, tensors: dict, *, num_layers: int, where: str) -> tuple[HeadConfig, dict]:
    """The head vLLM builds from the folder (its rules and defaults, never the draftsmith provenance entry)."""
    archs = list(config.get("architectures") or [])
    if "MedusaModel" in archs or config.get("model_type") == "medusa":
        return _read_medusa(config, tensors, where)
    if any("Eagle3" in a for a in archs):
        vocab, draft = int(config["vocab_size"]), int(get_field(config, "draft_vocab_size", config["vocab_size"]))
        if "d2t" in tensors and draft == vocab:
            raise ExportError(f"{where}: tensor 'd2t' with the full draft vocabulary ({vocab}): vLLM >= 0.30 has no "
                              f"draft_id_to_target_id parameter then and fails the load ('There is no module or "
                              f"parameter named draft_id_to_target_id'); expected no d2t/t2d")
        # llama_eagle3.load_weights: "midlayer." -> "layers.0."; both spellings load.
        tensors = rename_prefix(tensors, "layers.0.", "midlayer.")
        return read_eagle3(config, tensors, where=where, engine=NAME, num_layers=num_layers,
                           ids_key="eagle_aux_hidden_state_layer_ids", layer_source=config,
                           norm_before_residual_default=False)
    if any(a.startswith("Eagle") for a in archs) or archs == ["LlamaForCausalLM"]:
        if get_field(config, "add_para_norm", False):
            raise ExportError(f"{where}: add_para_norm is true (HASS norms); expected false")
        # vLLM's EAGLE-1 fc has no bias: an fc.bias tensor would be ignored (skipped by the loader).
        return read_eagle1(config, tensors, fc_bias=False)
    raise ExportError(f"{where}: architectures {archs} is no vLLM EAGLE/Medusa draft model; expected one of "
                      f"EagleLlamaForCausalLM, LlamaForCausalLMEagle3, Eagle3LlamaForCausalLM, MedusaModel")


def _read_medusa(config: dict, tensors: dict, where: str) -> tuple[HeadConfig, dict]:
    from draftsmith.serve.core.layers import FINAL

    # MedusaConfig.from_pretrained renames every key holding "num" + "heads"/"layers".
    renamed = dict(config)
    for key in list(config):
        if "num" in key and "heads" in key:
            renamed["num_heads"] = renamed.pop(key)
        elif "num" in key and "layers" in key:
            renamed["num_hidden_layers"] = renamed.pop(key)
    vocab = int(renamed["vocab_size"])
    truncated = int(get_field(renamed, "truncated_vocab_size", vocab))
    short = sorted({int(v.shape[0]) for k, v in tensors.items() if k.startswith("lm_heads.")} - {vocab})
    if truncated != vocab or short:
        raise ExportError(f"{where}: " + MEDUSA_FULL_VOCAB.format(vocab=vocab, draft=short[0] if short else truncated))
    if get_field(renamed, "original_lm_head", False):
        raise ExportError(f"{where}: original_lm_head is true (one shared lm_head); expected false")
    head_config = HeadConfig(method="medusa", model_type="llama", hidden_size=int(renamed["hidden_size"]),
                             vocab_size=vocab, draft_vocab_size=vocab,
                             num_speculative_tokens=int(get_field(renamed, "num_heads", 5)), aux_layer_ids=[FINAL],
                             medusa_num_layers=int(get_field(renamed, "num_hidden_layers", 1)))
    state = {k: v for k, v in tensors.items() if k.startswith(("blocks.", "lm_heads."))}
    if not get_field(renamed, "medusa_fc_bias", False):
        # vLLM builds bias-free ResBlocks and drops the stored biases: exactly a zero bias.
        state = {k: (torch.zeros_like(v) if k.endswith(".bias") else v) for k, v in state.items()}
    state.update(read_vocab_maps(None, vocab, vocab, where=where))
    return head_config, state


# ------------------------------------------------------------------------------------------- documentation

def usage(config: HeadConfig, *, out: str, facts: TargetFacts) -> str:
    k = config.num_speculative_tokens
    spec = {"model": out, "method": METHOD_FLAG[config.method], "num_speculative_tokens": k}
    return (f"```bash\nvllm serve {facts.verifier} --speculative-config '{json.dumps(spec)}'\n```\n\n"
            f"```python\nfrom vllm import LLM, SamplingParams\n\n"
            f"llm = LLM(model={facts.verifier!r}, speculative_config={spec!r})\n"
            f"print(llm.generate([\"Hello\"], SamplingParams(temperature=0, max_tokens=64))[0].outputs[0].text)\n```\n")


def notes(config: HeadConfig, facts: TargetFacts) -> list[str]:
    """What a user must know about engine versions (README and CLI)."""
    if config.method == "medusa":
        return ["vLLM versions: Medusa is served by vLLM 0.15–0.32 only (their releases ship medusa.py; loaded with "
                "vLLM 0.32.0's own Medusa class by scripts/check_engines.py). vLLM 0.33 removed Medusa (no "
                "medusa.py, no \"medusa\" method): for vLLM >= 0.33 train and export an EAGLE-3 drafter."]
    return [f"vLLM versions: loaded and drafted with vLLM's own {ARCHITECTURES[config.method][0]} in vLLM 0.32.0 and "
            f"0.33.0 (scripts/check_engines.py)."]


def package_check(out, target, head, *, where: str) -> str:
    return ""  # vLLM cannot be imported beside draftsmith; scripts/check_engines.py runs its loader
