"""EAGLE-3 in SGLang's format (`LlamaForCausalLMEagle3`).

What SGLang reads (python/sglang/srt/models/llama_eagle3.py, the EAGLE worker): `fc` (h, 3 * target_hidden_size)
with bias only if config `bias`; the layer is written as `midlayer.*` (SGLang < 0.5.15 loads only that name; later
ones rename it to `layers.0`); `hidden_norm`, `norm`, `lm_head` (draft_vocab_size, h); `d2t` becomes hot_token_id =
d2t + arange (written for a reduced vocabulary only: none means draft ids are target ids), `t2d` skipped;
`tie_word_embeddings: true` makes lm_head the embedding matrix and a missing `draft_vocab_size` loads the target's
lm_head, so both are written explicitly; aux ids from `eagle_config.eagle_aux_hidden_state_layer_ids` in SGLang's
convention (serve/export/layer_ids.py); embed_tokens replaced by the target's (`set_embed`). Names the loader does
not know are skipped silently.
"""
from __future__ import annotations

import torch

from draftsmith.serve.drafters.head_config import HeadConfig
from draftsmith.serve.export.common import ABSENT, Expect, ExportError, FormatSpec, TargetFacts, get_field
from draftsmith.serve.export.eagle import expected_llama_fields
from draftsmith.serve.export.engines import Support
from draftsmith.serve.export.layer_ids import aux_layer_ids_for
from draftsmith.serve.export.llama_config import llama_layer_config
from draftsmith.serve.export.method_export import FormatExport
from draftsmith.serve.methods.eagle3.export import (check, engine_tensors, expected_tensors, feature_norm_fields,
                                                    feature_norm_support, feature_norms, read_eagle3)

NAME = "sglang"
ARCHITECTURES = ("LlamaForCausalLMEagle3",)


def build(state: dict[str, torch.Tensor], config: HeadConfig, facts: TargetFacts) -> tuple[dict, dict]:
    # SGLang reads norm_before_fc from eagle_config first, then the top level; fc_norm and norm_output from the top
    # level
    body = {"architectures": list(ARCHITECTURES), **llama_layer_config(config),
            "draft_vocab_size": config.draft_vocab_size, "target_hidden_size": config.hidden_size, "bias": False,
            **feature_norms(config),
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": aux_layer_ids_for(config, NAME, facts.num_layers),
                             "use_aux_hidden_state": True, "norm_before_fc": bool(config.norm_before_fc)}}
    return body, engine_tensors(state, config, layer_prefix="midlayer")


def expected(config: HeadConfig, facts: TargetFacts) -> FormatSpec:
    text = facts.text
    fields = expected_llama_fields(text)
    fields["architectures"] = Expect(list(ARCHITECTURES), "SGLang's registry name of the draft model")
    ids = aux_layer_ids_for(config, NAME, facts.num_layers)
    fields.update({
        "draft_vocab_size": Expect(config.draft_vocab_size, "absent, SGLang loads the target's lm_head"),
        "target_hidden_size": Expect(int(text["hidden_size"]), "fc reads 3 x target_hidden_size"),
        "bias": Expect(False, "the drafter's fc has no bias", also=(ABSENT,)),
        "eagle_config.eagle_aux_hidden_state_layer_ids": Expect(ids, "SGLang convention: id i = output of "
                                                                      "layer i; absent means [2, n//2, n-3] "
                                                                      "layer inputs"),
        "eagle_config.use_aux_hidden_state": Expect(True, "fc over the aux layers", also=(ABSENT,)),
        **feature_norm_fields(config), **feature_norm_fields(config, prefix="eagle_config."),
    })
    for flag in ("fc_norm", "norm_output"):  # SGLang reads these from the top level only
        fields.pop(f"eagle_config.{flag}")
    return FormatSpec(NAME, config.method, fields, expected_tensors(config, text, layer_prefix="midlayer"),
                      engine_layer_ids=ids)


def read(config: dict, tensors: dict, *, num_layers: int, where: str) -> tuple[HeadConfig, dict]:
    if get_field(config, "tie_word_embeddings", True):
        raise ExportError(f"{where}: tie_word_embeddings is true or missing: SGLang would use the embedding "
                          f"matrix as the draft lm_head; expected false")
    if get_field(config, "draft_vocab_size", None) is None:
        raise ExportError(f"{where}: draft_vocab_size is missing: SGLang would load the target's lm_head instead "
                          f"of the drafter's; expected the drafter's vocabulary size")
    if get_field(config, "bias", False):
        raise ExportError(f"{where}: bias is true (fc with bias); draftsmith heads have none")
    # Only "midlayer.*" names find SGLang parameters (0.5.15+ also renames them to layers.0); skip the rest.
    tensors = {k: v for k, v in tensors.items() if not k.startswith("layers.")}
    return read_eagle3(config, tensors, where=where, engine=NAME, num_layers=num_layers,
                       ids_key="eagle_config.eagle_aux_hidden_state_layer_ids", layer_source=config,
                       norm_before_residual_default=False)


FORM = FormatExport(architectures=ARCHITECTURES, serve_as="EAGLE3", check=lambda config: check(config, NAME),
                    support=lambda config: feature_norm_support(config, NAME, "SGLang") or Support("SGLang"),
                    build=build, expected=expected,
                    claims=lambda config: ARCHITECTURES[0] in (config.get("architectures") or []), read=read,
                    hosted_as="EAGLE-3")
