"""EAGLE-3 in vLLM's own format (`LlamaForCausalLMEagle3`).

What vLLM reads (vllm/model_executor/models/llama_eagle3.py, the v1 EAGLE proposer): `fc` (h, 3 * target_hidden_size),
`midlayer.*` renamed to `layers.0.*` on load, q/k/v reading 2h, `hidden_norm`, `norm`, own `lm_head`
(draft_vocab_size, h), `d2t` loaded as draft_id_to_target_id (target = draft + d2t), `t2d` skipped;
`norm_before_residual` (default false here); aux ids from the top-level `eagle_aux_hidden_state_layer_ids` in vLLM's
convention (serve/export/layer_ids.py); embed_tokens shared from the target when the folder has none. From vLLM 0.30
a full draft vocabulary has NO draft_id_to_target_id parameter and a `d2t` tensor fails the load; before, a missing
d2t stays all zeros (identity): so d2t is written for a reduced vocabulary only.
"""
from __future__ import annotations

import torch

from draftsmith.serve.drafters.head_config import HeadConfig
from draftsmith.serve.export.common import ABSENT, Expect, ExportError, FormatSpec, TargetFacts, get_field
from draftsmith.serve.export.eagle import expected_llama_fields, rename_prefix, vllm_versions_note
from draftsmith.serve.export.engines import Support
from draftsmith.serve.export.layer_ids import aux_layer_ids_for
from draftsmith.serve.export.llama_config import llama_layer_config
from draftsmith.serve.export.method_export import FormatExport
from draftsmith.serve.methods.eagle3.export import (check, engine_tensors, expected_tensors, feature_norm_fields,
                                                    feature_norm_support, feature_norms, read_eagle3)

NAME = "vllm"
ARCHITECTURES = ("LlamaForCausalLMEagle3",)
ALSO = ("Eagle3LlamaForCausalLM",)  # the name older vLLM releases register; both load


def build(state: dict[str, torch.Tensor], config: HeadConfig, facts: TargetFacts) -> tuple[dict, dict]:
    body = {"architectures": list(ARCHITECTURES), **llama_layer_config(config),
            "draft_vocab_size": config.draft_vocab_size, "target_hidden_size": config.hidden_size,
            "norm_before_residual": False, **feature_norms(config),
            "eagle_aux_hidden_state_layer_ids": aux_layer_ids_for(config, NAME, facts.num_layers)}
    return body, engine_tensors(state, config, layer_prefix="midlayer")


def expected(config: HeadConfig, facts: TargetFacts) -> FormatSpec:
    text = facts.text
    fields = expected_llama_fields(text)
    fields["architectures"] = Expect(list(ARCHITECTURES), "vLLM's registry name of the draft model",
                                     also=(list(ALSO),))
    ids = aux_layer_ids_for(config, NAME, facts.num_layers)
    fields.update({
        "draft_vocab_size": Expect(config.draft_vocab_size, "rows of the draft lm_head"),
        "target_hidden_size": Expect(int(text["hidden_size"]), "fc reads 3 x target_hidden_size"),
        "norm_before_residual": Expect(False, "the drafter adds the un-normed fused state as residual"),
        **feature_norm_fields(config),
        "eagle_aux_hidden_state_layer_ids": Expect(ids, "vLLM convention: id i = input of layer i"),
        "eagle_config.use_aux_hidden_state": Expect(True, "fc over the aux layers", also=(ABSENT,)),
    })
    return FormatSpec(NAME, config.method, fields, expected_tensors(config, text, layer_prefix="midlayer"),
                      engine_layer_ids=ids)


# a folder naming the token of parallel drafting's mask slots is a P-EAGLE head (serve/methods/peagle/to_vllm.py)
PARALLEL_TOKEN_KEYS = ("mask_token_id", "pard_token", "ptd_token_id")


def eagle3_architecture(config: dict) -> bool:
    return any("Eagle3" in a for a in config.get("architectures") or [])


def claims(config: dict) -> bool:
    return eagle3_architecture(config) and all(config.get(key) is None for key in PARALLEL_TOKEN_KEYS)


def read(config: dict, tensors: dict, *, num_layers: int, where: str) -> tuple[HeadConfig, dict]:
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


FORM = FormatExport(architectures=ARCHITECTURES + ALSO, serve_as="eagle3", check=lambda config: check(config, NAME),
                    support=lambda config: feature_norm_support(config, NAME, "vLLM") or Support("vLLM", (0, 15)),
                    build=build, expected=expected, claims=claims, read=read, hosted_as="EAGLE-3",
                    notes=lambda config, facts: [vllm_versions_note(ARCHITECTURES[0])])
