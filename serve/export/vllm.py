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
  from the target when the folder has none.
- Medusa (MedusaConfig): `num_heads`, `num_hidden_layers` (ResBlocks per head), `truncated_vocab_size` with a
  `token_map` tensor (target ids) when smaller than `vocab_size`, `medusa_fc_bias` (default false: biases
  would be dropped silently), `original_lm_head` (false: one lm_head per head). Every top-level key holding
  "num" and "heads"/"layers" is renamed to num_heads/num_hidden_layers by MedusaConfig.from_pretrained.
"""
from __future__ import annotations

import torch

from serve.drafters.heads_common import HeadConfig, draft_token_ids
from serve.errors import DraftsmithError
from serve.export.common import ABSENT, Expect, FormatSpec
from serve.export.eagle import (check_eagle_exportable, eagle_tensors, expected_eagle_tensors, expected_llama_fields,
                                target_text_config)
from serve.export.layer_ids import aux_layer_ids_for
from serve.export.llama_config import llama_layer_config

NAME = "vllm"
METHODS = ("eagle1", "eagle3", "medusa")
ARCHITECTURES = {"eagle1": ["EagleLlamaForCausalLM"], "eagle3": ["LlamaForCausalLMEagle3"], "medusa": ["MedusaModel"]}
METHOD_FLAG = {"eagle1": "eagle", "eagle3": "eagle3", "medusa": "medusa"}  # speculative_config "method"



def build(state: dict[str, torch.Tensor], config: HeadConfig, *, num_layers: int) -> tuple[dict, dict]:
    """(config.json body without provenance, tensors) for the native head's `state`."""
    if config.method not in METHODS:
        raise DraftsmithError(f"--format vllm cannot export method {config.method!r}")
    if config.method == "medusa":
        return _medusa(state, config)
    check_eagle_exportable(config, NAME)
    if config.method == "eagle1" and config.fc_bias:
        raise DraftsmithError("--format vllm eagle1: vLLM's EagleLlamaForCausalLM builds fc without a bias "
                              "(llama_eagle.py), but this drafter was trained with fc_bias=true; export --format "
                              "sglang, or retrain with model.fc_bias=false")
    body = {"architectures": ARCHITECTURES[config.method], **llama_layer_config(config)}
    if config.method == "eagle1":
        body["add_para_norm"] = False  # HASS extra norms off
    else:
        body.update(draft_vocab_size=config.draft_vocab_size, target_hidden_size=config.hidden_size,
                    norm_before_residual=False, norm_before_fc=False,
                    eagle_aux_hidden_state_layer_ids=aux_layer_ids_for(config, NAME, num_layers))
    tensors = eagle_tensors(state, config, layer_prefix="midlayer" if config.method == "eagle3" else "layers.0",
                            vocab_maps=True)
    return body, tensors


def _medusa(state: dict[str, torch.Tensor], config: HeadConfig) -> tuple[dict, dict]:
    body = {"model_type": "medusa", "architectures": ARCHITECTURES["medusa"], "hidden_size": config.hidden_size,
            "vocab_size": config.vocab_size, "num_heads": config.num_speculative_tokens,
            "num_hidden_layers": config.medusa_num_layers, "truncated_vocab_size": config.draft_vocab_size,
            "medusa_fc_bias": True, "original_lm_head": False}
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in state.items() if k not in ("d2t", "t2d")}
    if config.uses_draft_vocab:
        tensors["token_map"] = draft_token_ids(state["d2t"].to(torch.long)).contiguous()  # (Vd,) target ids
    return body, tensors


def expected(config: HeadConfig, target) -> FormatSpec:
    """What vLLM reads for this drafter, from the native config and the target's config alone."""
    text = target_text_config(target)
    n = int(text["num_hidden_layers"])
    if config.method == "medusa":
        return _expected_medusa(config, text)
    fields = expected_llama_fields(text)
    fields["architectures"] = Expect(ARCHITECTURES[config.method], "vLLM's registry name of the draft model",
                                     also=(["Eagle3LlamaForCausalLM"],) if config.method == "eagle3" else ())
    ids = None
    if config.method == "eagle1":
        fields["add_para_norm"] = Expect(False, "HASS extra norms the drafter does not have", also=(ABSENT,))
    else:
        ids = aux_layer_ids_for(config, NAME, n)
        fields.update({
            "draft_vocab_size": Expect(config.draft_vocab_size, "rows of the draft lm_head"),
            "target_hidden_size": Expect(int(text["hidden_size"]), "fc reads 3 x target_hidden_size"),
            "norm_before_residual": Expect(False, "the drafter adds the un-normed fused state as residual"),
            "norm_before_fc": Expect(False, "no norm before fc", also=(ABSENT,)),
            "eagle_aux_hidden_state_layer_ids": Expect(ids, "vLLM convention: id i = input of layer i"),
            "eagle_config.use_aux_hidden_state": Expect(True, "fc over the aux layers", also=(ABSENT,)),
        })
    tensors = expected_eagle_tensors(config, text, layer_prefix="midlayer" if config.method == "eagle3" else "layers.0",
                                     fc_bias=False, vocab_maps=True)
    return FormatSpec(NAME, config.method, fields, tensors, engine_layer_ids=ids or [])


def _expected_medusa(config: HeadConfig, text: dict) -> FormatSpec:
    h, vocab = int(text["hidden_size"]), int(text["vocab_size"])
    heads, layers, vd = config.num_speculative_tokens, config.medusa_num_layers, config.draft_vocab_size
    fields = {
        "model_type": Expect("medusa"), "architectures": Expect(["MedusaModel"]),
        "hidden_size": Expect(h), "vocab_size": Expect(vocab), "num_heads": Expect(heads),
        "num_hidden_layers": Expect(layers, "ResBlocks per head"),
        "truncated_vocab_size": Expect(vd, "rows of each lm_head", also=(ABSENT,) if vd == vocab else ()),
        "medusa_fc_bias": Expect(True, "without it vLLM builds bias-free ResBlocks and drops the trained biases"),
        "original_lm_head": Expect(False, "one lm_head per head", also=(ABSENT,)),
    }
    tensors: dict = {}
    for i in range(heads):
        for j in range(layers):
            tensors[f"blocks.{i}.layers.{j}.weight"] = ((h, h), None)
            tensors[f"blocks.{i}.layers.{j}.bias"] = ((h,), None)
        tensors[f"lm_heads.{i}.weight"] = ((vd, h), None)
    if vd != vocab:
        tensors["token_map"] = ((vd,), torch.long)
    return FormatSpec(NAME, "medusa", fields, tensors)


def check_extra(config: dict) -> list[str]:
    """Problems a FormatSpec cannot express: Medusa keys MedusaConfig would rename onto num_heads/num_hidden_layers."""
    if config.get("model_type") != "medusa":
        return []
    clobber = [k for k in config if "num" in k and (("heads" in k and k != "num_heads")
                                                     or ("layers" in k and k != "num_hidden_layers"))]
    return [f"config field {k!r} would be renamed by vLLM's MedusaConfig onto num_heads/num_hidden_layers; expected "
            f"absent" for k in clobber]


def usage(config: HeadConfig, *, out: str, target_ref: str) -> str:
    k = config.num_speculative_tokens
    spec = {"model": out, "method": METHOD_FLAG[config.method], "num_speculative_tokens": k}
    import json

    flag = json.dumps(spec)
    return (f"```bash\nvllm serve {target_ref} --speculative-config '{flag}'\n```\n\n"
            f"```python\nfrom vllm import LLM, SamplingParams\n\n"
            f"llm = LLM(model={target_ref!r}, speculative_config={spec!r})\n"
            f"print(llm.generate([\"Hello\"], SamplingParams(temperature=0, max_tokens=64))[0].outputs[0].text)\n```\n")
