"""EAGLE-1's engine forms: vLLM's `EagleLlamaForCausalLM` and SGLang's `LlamaForCausalLMEagle`. The speculators
format (and vLLM's reader of it) has EAGLE-3 only.

- vLLM (vllm/model_executor/models/llama_eagle.py, vllm/transformers_utils/configs/eagle.py): a Llama config; `fc`
  (h, 2h) built WITHOUT bias (v1 llama_eagle.py; PRs to read `bias` from the config, vllm-project/vllm#22323 and
  #22558, were closed; a config `bias` turns on attention biases instead); `layers.0.*` with input_layernorm
  replaced by an identity; embeddings and lm_head shared from the target. Architecture `Eagle{Arch}` (EAGLEConfig
  adds the prefix to a plain `LlamaForCausalLM`).
- SGLang (python/sglang/srt/models/llama_eagle.py): `fc` is `nn.Linear(2h, h)` WITH a bias, always: a head trained
  without one is exported with an all-zero `fc.bias` (same maths); `layers.{i}.*`, layer 0's input_layernorm
  skipped; embeddings and lm_head are replaced by the target's (`set_embed_and_head`).
"""
from __future__ import annotations

import torch

from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.core.layers import FINAL
from draftsmith.serve.drafters.head_config import HeadConfig
from draftsmith.serve.export.common import ABSENT, Expect, ExportError, FormatSpec, TargetFacts, get_field
from draftsmith.serve.export.eagle import (eagle_tensors, expected_layer_tensors, expected_llama_fields,
                                           read_eagle_config, vllm_versions_note)
from draftsmith.serve.export.engines import Support
from draftsmith.serve.export.llama_config import check_llama_like, llama_layer_config
from draftsmith.serve.export.method_export import FormatExport

LAYER = "layers.0"  # the decoder layer's name, in the head and in both engines
VLLM_ARCHITECTURES = ("EagleLlamaForCausalLM",)
SGLANG_ARCHITECTURES = ("LlamaForCausalLMEagle",)


def _check(config: HeadConfig, fmt: str) -> None:
    check_llama_like(config, fmt)
    if config.input_layernorm:
        raise DraftsmithError(f"--format {fmt}: the engines' EAGLE-1 layer skips layers.0.input_layernorm, but this "
                              f"drafter was trained with it (input_layernorm=true)")


def read_eagle1(config: dict, tensors: dict, *, fc_bias: bool) -> tuple[HeadConfig, dict]:
    """EAGLE-1 as both engines build it: layer 0 without input_layernorm, fc bias as the engine builds it."""
    state = {k: v for k, v in tensors.items() if "input_layernorm" not in k and (fc_bias or k != "fc.bias")}
    return read_eagle_config("eagle1", config, aux_layer_ids=[FINAL], input_layernorm=False, fc_bias=fc_bias), state


def _tensors(text: dict, *, fc_bias: bool) -> dict:
    return expected_layer_tensors(text, layer_prefix=LAYER, fc_inputs=2, fused_input=False, fc_bias=fc_bias)


# ---------------------------------------------------------------------------------------------------------- vLLM

def vllm_check(config: HeadConfig) -> None:
    _check(config, "vllm")
    if config.fc_bias:
        raise DraftsmithError("--format vllm eagle1: vLLM's EagleLlamaForCausalLM builds fc without a bias "
                              "(llama_eagle.py), but this drafter was trained with fc_bias=true; export --format "
                              "sglang, or retrain with model.fc_bias=false")


def vllm_build(state: dict[str, torch.Tensor], config: HeadConfig, facts: TargetFacts) -> tuple[dict, dict]:
    body = {"architectures": list(VLLM_ARCHITECTURES), **llama_layer_config(config), "add_para_norm": False}
    return body, eagle_tensors(state, config, native_prefix=f"{LAYER}.", layer_prefix=LAYER)


def vllm_expected(config: HeadConfig, facts: TargetFacts) -> FormatSpec:
    fields = expected_llama_fields(facts.text)
    fields["architectures"] = Expect(list(VLLM_ARCHITECTURES), "vLLM's registry name of the draft model")
    fields["add_para_norm"] = Expect(False, "HASS extra norms the drafter does not have", also=(ABSENT,))
    return FormatSpec("vllm", config.method, fields, _tensors(facts.text, fc_bias=False))


def vllm_claims(config: dict) -> bool:
    """EagleConfig prefixes a plain LlamaForCausalLM with `Eagle`; an un-prefixed one loads as EAGLE-1 too."""
    archs = list(config.get("architectures") or [])
    return not any("Eagle3" in a for a in archs) and (any(a.startswith("Eagle") for a in archs)
                                                      or archs == ["LlamaForCausalLM"])


def vllm_read(config: dict, tensors: dict, *, num_layers: int, where: str) -> tuple[HeadConfig, dict]:
    if get_field(config, "add_para_norm", False):
        raise ExportError(f"{where}: add_para_norm is true (HASS norms); expected false")
    # vLLM's EAGLE-1 fc has no bias: an fc.bias tensor would be ignored (skipped by the loader).
    return read_eagle1(config, tensors, fc_bias=False)


# -------------------------------------------------------------------------------------------------------- SGLang

def sglang_build(state: dict[str, torch.Tensor], config: HeadConfig, facts: TargetFacts) -> tuple[dict, dict]:
    body = {"architectures": list(SGLANG_ARCHITECTURES), **llama_layer_config(config)}
    return body, eagle_tensors(state, config, native_prefix=f"{LAYER}.", layer_prefix=LAYER, zero_fc_bias=True)


def sglang_expected(config: HeadConfig, facts: TargetFacts) -> FormatSpec:
    fields = expected_llama_fields(facts.text)
    fields["architectures"] = Expect(list(SGLANG_ARCHITECTURES), "SGLang's registry name of the draft model")
    return FormatSpec("sglang", config.method, fields, _tensors(facts.text, fc_bias=True))


def sglang_read(config: dict, tensors: dict, *, num_layers: int, where: str) -> tuple[HeadConfig, dict]:
    # SGLang's EAGLE-1 fc is nn.Linear(2h, h) with a bias, always; layer 0 skips input_layernorm.
    return read_eagle1(config, tensors, fc_bias=True)


EXPORTS = {
    "vllm": FormatExport(architectures=VLLM_ARCHITECTURES, serve_as="eagle", check=vllm_check,
                         support=lambda config: Support("vLLM", (0, 15)), build=vllm_build, expected=vllm_expected,
                         claims=vllm_claims, read=vllm_read, hosted_as="EAGLE-1",
                         notes=lambda config, facts: [vllm_versions_note(VLLM_ARCHITECTURES[0])]),
    "sglang": FormatExport(architectures=SGLANG_ARCHITECTURES, serve_as="EAGLE",
                           check=lambda config: _check(config, "sglang"), support=lambda config: Support("SGLang"),
                           build=sglang_build, expected=sglang_expected,
                           claims=lambda config: SGLANG_ARCHITECTURES[0] in (config.get("architectures") or []),
                           read=sglang_read, hosted_as="EAGLE-1"),
}
