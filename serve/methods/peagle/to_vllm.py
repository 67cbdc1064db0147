"""P-EAGLE in vLLM's own format: an EAGLE-3 folder (`LlamaForCausalLMEagle3`, serve/methods/eagle3/to_vllm.py) with
the mask slots' token and hidden vector, served with `"parallel_drafting": true` in the speculative config.

What vLLM reads, from every release's source (0.16-0.33 llama_eagle3.py and the EAGLE proposer): `mask_hidden`
(any shape of 3 * hidden_size elements, loaded `.view(1, -1)` into a buffer; a missing one fails the load when
parallel drafting is on), passed through `combine_hidden_states` (the aux-feature norms and fc) once at load, so it
is stored in the engine's ascending aux-layer order like fc's column blocks; the slots' token from the draft
config's `ptd_token_id` (0.16-0.33 all read it; `pard_token` first, `mask_token_id` first from 0.33). vLLM 0.34
refuses P-EAGLE ("not supported") and ignores `parallel_drafting` for EAGLE-3, so the range ends at 0.33. The
number of tokens drafted is the serving command's `num_speculative_tokens`; vLLM drafts that many slots whatever
the head was trained for, so the reader drafts as many as it is asked.
"""
from __future__ import annotations

import dataclasses

import torch

from draftsmith.serve.drafters.head_config import HeadConfig
from draftsmith.serve.export.common import ABSENT, Expect, ExportError, TargetFacts
from draftsmith.serve.export.engines import Support
from draftsmith.serve.methods.eagle3 import to_vllm as eagle3
from draftsmith.serve.methods.eagle3.export import engine_order, first_release_for
from draftsmith.serve.export.method_export import FormatExport

TOKEN_KEY = "ptd_token_id"  # the slots' token, read by every release that serves parallel drafting
TOKEN_KEYS = eagle3.PARALLEL_TOKEN_KEYS  # what a folder may carry it as (vLLM 0.33 reads all three, in this order)
FIRST, LAST = (0, 16), (0, 33)  # parallel drafting for EAGLE-3 arrives in 0.16; 0.34 refuses it
DEPTHS_READ = 16  # what the reader's head drafts at most: the engine drafts what its serving command asks


def _as_eagle3(config: HeadConfig) -> HeadConfig:
    return dataclasses.replace(config, method="eagle3")


def check(config: HeadConfig) -> None:
    eagle3.FORM.check(_as_eagle3(config))


def support(config: HeadConfig) -> Support:
    first = max(FIRST, first_release_for(config, "vllm") or FIRST)
    return Support("vLLM", first, LAST, why="vLLM serves P-EAGLE (EAGLE-3 with parallel_drafting) from 0.16 to 0.33; "
                   "0.34 refuses it and drafts the head as plain EAGLE-3, without its mask slots",
                   fix="Use vLLM 0.33, or train model.method=eagle3 (or dflash) for vLLM 0.34.")


def mask_hidden_in_engine_order(mask_hidden: torch.Tensor, aux_layer_ids: list[int]) -> torch.Tensor:
    """(n*h,) in the head's aux order -> (1, n*h) in ascending layer order."""
    chunks = mask_hidden.detach().to("cpu").chunk(len(aux_layer_ids))
    return torch.cat([chunks[j] for j in engine_order(aux_layer_ids)])[None].contiguous()


def build(state: dict[str, torch.Tensor], config: HeadConfig, facts: TargetFacts) -> tuple[dict, dict]:
    body, tensors = eagle3.build({k: v for k, v in state.items() if k != "mask_hidden"}, _as_eagle3(config), facts)
    body[TOKEN_KEY] = config.mask_token_id
    tensors["mask_hidden"] = mask_hidden_in_engine_order(state["mask_hidden"], list(config.aux_layer_ids))
    return body, tensors


def expected(config: HeadConfig, facts: TargetFacts):
    spec = eagle3.expected(_as_eagle3(config), facts)
    spec.config[TOKEN_KEY] = Expect(config.mask_token_id, "the token vLLM fills the mask slots with")
    spec.config["pard_token"] = Expect(ABSENT, "read before ptd_token_id: it would name another token")
    spec.config["mask_token_id"] = Expect(ABSENT, "read first by vLLM 0.33: it would name another token")
    spec.tensors["mask_hidden"] = ((1, len(config.aux_layer_ids) * config.hidden_size), None)
    return dataclasses.replace(spec, method="peagle")


def _token(config: dict):
    return next((config[key] for key in TOKEN_KEYS if config.get(key) is not None), None)


def claims(config: dict) -> bool:
    return eagle3.eagle3_architecture(config) and _token(config) is not None


def read(config: dict, tensors: dict, *, num_layers: int, where: str) -> tuple[HeadConfig, dict]:
    if "mask_hidden" not in tensors:
        raise ExportError(f"{where}: {TOKEN_KEY} names a parallel-drafting head, and tensor 'mask_hidden' is "
                          f"missing: vLLM fails the load with parallel_drafting on")
    head_config, state = eagle3.read(config, {k: v for k, v in tensors.items() if k != "mask_hidden"},
                                     num_layers=num_layers, where=where)
    # read_eagle3 sorts the aux ids ascending: the engine-order mask_hidden is the head's order too
    state["mask_hidden"] = tensors["mask_hidden"].reshape(-1)
    return dataclasses.replace(head_config, method="peagle", mask_token_id=int(_token(config)),
                               num_speculative_tokens=DEPTHS_READ, ttt_steps=1), state


def _notes(config: HeadConfig, facts: TargetFacts) -> list[str]:
    return ["vLLM versions: 0.16-0.33 serve P-EAGLE as EAGLE-3 with `\"parallel_drafting\": true` (the command "
            "above); 0.34 refuses it."]


FORM = FormatExport(architectures=eagle3.ARCHITECTURES + eagle3.ALSO, serve_as="eagle3", check=check, support=support,
                    build=build, expected=expected, claims=claims, read=read, hosted_as="EAGLE-3", notes=_notes,
                    serve_options={"parallel_drafting": True})
