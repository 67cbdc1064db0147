"""SGLang's draft formats: EAGLE-1 (`LlamaForCausalLMEagle`) and EAGLE-3 (`LlamaForCausalLMEagle3`).

What SGLang reads (python/sglang/srt/models/llama_eagle.py, llama_eagle3.py, the EAGLE worker):
- EAGLE-1: `fc` is `nn.Linear(2h, h)` WITH a bias, always: a head trained without one is exported with an
  all-zero `fc.bias` (same maths); `layers.{i}.*`, layer 0's input_layernorm skipped; embeddings and lm_head
  are replaced by the target's (`set_embed_and_head`).
- EAGLE-3: `fc` (h, 3 * target_hidden_size) with bias only if config `bias`; the layer is written as `midlayer.*`
  (SGLang < 0.5.15 loads only that name; later ones rename it to `layers.0`); `hidden_norm`, `norm`, `lm_head`
  (draft_vocab_size, h); `d2t` becomes hot_token_id = d2t + arange (written for a reduced vocabulary only:
  none means draft ids are target ids), `t2d` skipped; `tie_word_embeddings: true` makes lm_head the
  embedding matrix and a missing `draft_vocab_size` loads the target's lm_head, so both are written
  explicitly; aux ids from `eagle_config.eagle_aux_hidden_state_layer_ids` in SGLang's convention
  (serve/export/layer_ids.py); embed_tokens replaced by the target's (`set_embed`). Names the loader does not
  know are skipped silently.
SGLang has no Medusa drafter.
"""
from __future__ import annotations

import torch

from draftsmith.serve.drafters.head_config import HeadConfig
from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.export.common import ABSENT, Expect, ExportError, FormatSpec, TargetFacts, get_field
from draftsmith.serve.export.eagle import (check_eagle_exportable, eagle_tensors, expected_eagle_tensors,
                                           expected_llama_fields, feature_norm_fields, feature_norm_support,
                                           feature_norms, read_eagle1, read_eagle3)
from draftsmith.serve.export.engines import Support
from draftsmith.serve.export.layer_ids import aux_layer_ids_for
from draftsmith.serve.export.llama_config import llama_layer_config

NAME = "sglang"
ENGINE = "SGLang"
METHODS = ("eagle1", "eagle3")
ARCHITECTURES = {"eagle1": ["LlamaForCausalLMEagle"], "eagle3": ["LlamaForCausalLMEagle3"]}
ALGORITHM = {"eagle1": "EAGLE", "eagle3": "EAGLE3"}


def support(config: HeadConfig) -> Support:
    return feature_norm_support(config, NAME, ENGINE) or Support(ENGINE)


def check_exportable(config: HeadConfig) -> None:
    if config.method not in METHODS:
        raise DraftsmithError(f"--format sglang cannot export method {config.method!r}: SGLang has no Medusa "
                              f"drafter; use --format vllm")
    check_eagle_exportable(config, NAME)


def build(state: dict[str, torch.Tensor], config: HeadConfig, facts: TargetFacts) -> tuple[dict, dict]:
    check_exportable(config)
    body = {"architectures": ARCHITECTURES[config.method], **llama_layer_config(config)}
    if config.method == "eagle3":
        # SGLang reads norm_before_fc from eagle_config first, then the top level; fc_norm from the top level
        body.update(draft_vocab_size=config.draft_vocab_size, target_hidden_size=config.hidden_size, bias=False,
                    **feature_norms(config),
                    eagle_config={"eagle_aux_hidden_state_layer_ids": aux_layer_ids_for(config, NAME,
                                                                                       facts.num_layers),
                                  "use_aux_hidden_state": True, "norm_before_fc": bool(config.norm_before_fc)})
        tensors = eagle_tensors(state, config, layer_prefix="midlayer")
    else:
        tensors = eagle_tensors(state, config, layer_prefix="layers.0", zero_fc_bias=True)
    return body, tensors


def expected(config: HeadConfig, facts: TargetFacts) -> FormatSpec:
    text = facts.text
    fields = expected_llama_fields(text)
    fields["architectures"] = Expect(ARCHITECTURES[config.method], "SGLang's registry name of the draft model")
    ids = None
    if config.method == "eagle3":
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
        fields.pop("eagle_config.fc_norm")  # SGLang reads fc_norm from the top level only
    tensors = expected_eagle_tensors(config, text, layer_prefix="midlayer" if config.method == "eagle3" else "layers.0",
                                     fc_bias=config.method == "eagle1")
    return FormatSpec(NAME, config.method, fields, tensors, engine_layer_ids=ids or [])


def check_extra(config: dict) -> list[str]:
    return []


def read(config: dict, tensors: dict, *, num_layers: int, where: str) -> tuple[HeadConfig, dict]:
    """The head SGLang builds from the folder (its rules and defaults, never the draftsmith provenance entry)."""
    archs = list(config.get("architectures") or [])
    if "LlamaForCausalLMEagle3" in archs:
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
    if "LlamaForCausalLMEagle" in archs:
        # SGLang's EAGLE-1 fc is nn.Linear(2h, h) with a bias, always; layer 0 skips input_layernorm.
        return read_eagle1(config, tensors, fc_bias=True)
    raise ExportError(f"{where}: architectures {archs} is no SGLang EAGLE draft model; expected "
                      f"LlamaForCausalLMEagle or LlamaForCausalLMEagle3")


def usage(config: HeadConfig, *, out: str, facts: TargetFacts) -> str:
    k = config.num_speculative_tokens
    return (f"```bash\npython -m sglang.launch_server --model-path {facts.verifier} \\\n"
            f"    --speculative-algorithm {ALGORITHM[config.method]} --speculative-draft-model-path {out} \\\n"
            f"    --speculative-num-steps {k} --speculative-eagle-topk 1 "
            f"--speculative-num-draft-tokens {k + 1}\n```\n\n"
            f"(`--speculative-eagle-topk 1` drafts a chain of {k} tokens, what this drafter was validated with; "
            f"raise topk and num-draft-tokens for EAGLE-2 style trees.)\n")


def notes(config: HeadConfig, facts: TargetFacts) -> list[str]:
    return []


def package_check(out, target, head, *, where: str) -> str:
    return ""  # SGLang cannot be imported beside draftsmith; scripts/check_engines.py runs its loader
