"""SGLang's draft formats: EAGLE-1 (`LlamaForCausalLMEagle`) and EAGLE-3 (`LlamaForCausalLMEagle3`).

What SGLang reads (python/sglang/srt/models/llama_eagle.py, llama_eagle3.py, the EAGLE worker):
- EAGLE-1: `fc` is `nn.Linear(2h, h)` WITH a bias, always: a head trained without one is exported with an
  all-zero `fc.bias` (same maths); `layers.{i}.*`, layer 0's input_layernorm skipped; embeddings and lm_head
  are replaced by the target's (`set_embed_and_head`).
- EAGLE-3: `fc` (h, 3 * target_hidden_size) with bias only if config `bias`; the layer is loaded from
  `midlayer.*` only (a `layers.0.*` name finds no parameter and is skipped, leaving random weights);
  `hidden_norm`, `norm`, `lm_head` (draft_vocab_size, h); `d2t` becomes hot_token_id = d2t + arange, `t2d`
  skipped; `tie_word_embeddings: true` makes lm_head the embedding matrix and a missing `draft_vocab_size`
  loads the target's lm_head, so both are written explicitly; aux ids from
  `eagle_config.eagle_aux_hidden_state_layer_ids` in SGLang's convention (serve/export/layer_ids.py);
  embed_tokens replaced by the target's (`set_embed`).
SGLang has no Medusa drafter.
"""
from __future__ import annotations

import torch

from serve.drafters.heads_common import HeadConfig
from serve.errors import DraftsmithError
from serve.export.common import ABSENT, Expect, FormatSpec
from serve.export.eagle import (check_eagle_exportable, eagle_tensors, expected_eagle_tensors, expected_llama_fields,
                                target_text_config)
from serve.export.layer_ids import aux_layer_ids_for
from serve.export.llama_config import llama_layer_config

NAME = "sglang"
METHODS = ("eagle1", "eagle3")
ARCHITECTURES = {"eagle1": ["LlamaForCausalLMEagle"], "eagle3": ["LlamaForCausalLMEagle3"]}
ALGORITHM = {"eagle1": "EAGLE", "eagle3": "EAGLE3"}



def build(state: dict[str, torch.Tensor], config: HeadConfig, *, num_layers: int) -> tuple[dict, dict]:
    if config.method not in METHODS:
        raise DraftsmithError(f"--format sglang cannot export method {config.method!r}: SGLang has no Medusa "
                              f"drafter; use --format vllm")
    check_eagle_exportable(config, NAME)
    body = {"architectures": ARCHITECTURES[config.method], **llama_layer_config(config)}
    if config.method == "eagle3":
        body.update(draft_vocab_size=config.draft_vocab_size, target_hidden_size=config.hidden_size, bias=False,
                    eagle_config={"eagle_aux_hidden_state_layer_ids": aux_layer_ids_for(config, NAME, num_layers),
                                  "use_aux_hidden_state": True})
        tensors = eagle_tensors(state, config, layer_prefix="midlayer", vocab_maps=True)
    else:
        tensors = eagle_tensors(state, config, layer_prefix="layers.0", vocab_maps=False, zero_fc_bias=True)
    return body, tensors


def expected(config: HeadConfig, target) -> FormatSpec:
    text = target_text_config(target)
    n = int(text["num_hidden_layers"])
    fields = expected_llama_fields(text)
    fields["architectures"] = Expect(ARCHITECTURES[config.method], "SGLang's registry name of the draft model")
    ids = None
    if config.method == "eagle3":
        ids = aux_layer_ids_for(config, NAME, n)
        fields.update({
            "draft_vocab_size": Expect(config.draft_vocab_size, "absent, SGLang loads the target's lm_head"),
            "target_hidden_size": Expect(int(text["hidden_size"]), "fc reads 3 x target_hidden_size"),
            "bias": Expect(False, "the drafter's fc has no bias", also=(ABSENT,)),
            "eagle_config.eagle_aux_hidden_state_layer_ids": Expect(ids, "SGLang convention: id i = output of "
                                                                          "layer i; absent means [2, n//2, n-3] "
                                                                          "layer inputs"),
            "eagle_config.use_aux_hidden_state": Expect(True, "fc over the aux layers", also=(ABSENT,)),
        })
    tensors = expected_eagle_tensors(config, text, layer_prefix="midlayer" if config.method == "eagle3" else "layers.0",
                                     fc_bias=config.method == "eagle1", vocab_maps=config.method == "eagle3")
    return FormatSpec(NAME, config.method, fields, tensors, engine_layer_ids=ids or [])


def check_extra(config: dict) -> list[str]:
    return []


def usage(config: HeadConfig, *, out: str, target_ref: str) -> str:
    k = config.num_speculative_tokens
    return (f"```bash\npython -m sglang.launch_server --model-path {target_ref} \\\n"
            f"    --speculative-algorithm {ALGORITHM[config.method]} --speculative-draft-model-path {out} \\\n"
            f"    --speculative-num-steps {k} --speculative-eagle-topk 1 "
            f"--speculative-num-draft-tokens {k + 1}\n```\n\n"
            f"(`--speculative-eagle-topk 1` drafts a chain of {k} tokens, what this drafter was validated with; "
            f"raise topk and num-draft-tokens for EAGLE-2 style trees.)\n")
