"""What EAGLE-3's engine forms share (to_vllm.py, to_sglang.py, to_speculators.py): the checks every engine makes,
the norms before fc and the releases that read them, the tensors in the engines' order, and the reading of an
EAGLE-3 folder with an engine's flags and defaults.

Two engine facts shape the mapping (vLLM llama.py and SGLang llama.py alike):
- the target appends aux hidden states while looping over its layers, `if idx in aux_layers`, so the fc input
  is the concatenation in ASCENDING layer order whatever order the config lists; our head concatenates in
  its config order, so the exporter permutes fc.weight's column blocks to ascending order;
- membership is a set test, so a layer listed twice is captured once and the fc input is short: refused.
"""
from __future__ import annotations

import torch

from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.core.layers import EAGLE3_NUM_AUX as NUM_AUX  # vLLM and SGLang size fc as 3 * target_hidden_size
from draftsmith.serve.drafters.head_config import HeadConfig
from draftsmith.serve.export.common import ABSENT, Expect, ExportError, get_field
from draftsmith.serve.export.eagle import (eagle_tensors, expected_layer_tensors, read_eagle_config,
                                           read_vocab_maps)
from draftsmith.serve.export.layer_ids import engine_default_layer_ids, from_engine_layer_ids
from draftsmith.serve.export.llama_config import check_llama_like

NATIVE_LAYER = "midlayer."  # the head's decoder layer (vLLM's llama_eagle3 name)


def check(config: HeadConfig, fmt: str) -> None:
    """Refuse a head no EAGLE-3 engine loads."""
    check_llama_like(config, fmt)
    aux = list(config.aux_layer_ids)
    if len(aux) != NUM_AUX:
        raise DraftsmithError(f"--format {fmt}: EAGLE-3 engines read exactly {NUM_AUX} aux layers (fc is "
                              f"3*hidden wide); this drafter reads {len(aux)}: {aux}")
    if len(set(aux)) != len(aux):
        raise DraftsmithError(f"--format {fmt}: aux layer ids {aux} repeat a layer; engines capture each layer "
                              f"once, so the fc input would be short. Retrain with distinct model.aux_layer_ids")
    if not config.hidden_norm:
        raise DraftsmithError(f"--format {fmt}: the engines' EAGLE-3 layer always norms the fused hidden state "
                              f"(hidden_norm); this drafter was trained without it")


# EAGLE-3's norms, as the engines name them (vLLM llama_eagle3.py, SGLang llama_eagle3.py, speculators
# Eagle3DraftModel): `norm_before_fc` = one RMSNorm over the concatenated aux states, tensor `input_norm.weight`
# (n*h,); `fc_norm` = one RMSNorm per aux state, tensors `fc_norm.{i}.weight` (h,); `norm_output` = the next step
# reads norm(out) (EAGLE-3.1; no tensor of its own). The first releases that read each flag, per format (from every
# release's source): below them the tensor or the flag is dropped silently, a wrong model.
FEATURE_NORM_FIRST = {
    "vllm": {"norm_before_fc": (0, 18), "fc_norm": (0, 22), "norm_output": (0, 22)},
    "speculators": {"norm_before_fc": (0, 19), "fc_norm": (0, 25), "norm_output": (0, 25)},  # vLLM's speculators reader
    "sglang": {"norm_before_fc": (0, 5, 18), "fc_norm": (0, 5, 15), "norm_output": (0, 5, 12)},
}


def feature_norms(config: HeadConfig) -> dict[str, bool]:
    """The head's norms as engine config flags."""
    return {"norm_before_fc": bool(config.norm_before_fc), "fc_norm": bool(config.fc_norm),
            "norm_output": bool(config.norm_output)}


def first_release_for(config: HeadConfig, fmt: str):
    """The oldest release of the format's engine that reads every norm this head has (None: no norm)."""
    firsts = [FEATURE_NORM_FIRST[fmt][flag] for flag, on in feature_norms(config).items() if on]
    return max(firsts) if firsts else None


def feature_norm_support(config: HeadConfig, fmt: str, engine: str):
    """engines.Support for a head with any of these norms (None: it has none, the format's own range holds)."""
    from draftsmith.serve.export.engines import Support

    first = first_release_for(config, fmt)
    if first is None:
        return None
    flags = [flag for flag, on in feature_norms(config).items() if on]
    return Support(engine, first, why=f"older releases do not read {' / '.join(flags)} and would serve another "
                                      f"model silently",
                   fix=f"Use a newer release, or retrain without {' / '.join('model.' + f for f in flags)}.")


def feature_norm_fields(config: HeadConfig, *, prefix: str = "") -> dict[str, Expect]:
    """The config flags of the head's norms; false may also be left out (every engine defaults it)."""
    out = {}
    for flag, on in feature_norms(config).items():
        why = f"the drafter {'has' if on else 'has no'} {flag}"
        out[prefix + flag] = Expect(on, why) if on else Expect(False, why, also=(ABSENT,))
    return out


def engine_order(aux_layer_ids: list[int]) -> list[int]:
    """Positions of the aux ids in ascending layer order: the order engines concatenate the aux states in."""
    return sorted(range(len(aux_layer_ids)), key=lambda j: aux_layer_ids[j])


def fc_in_engine_order(fc_weight: torch.Tensor, aux_layer_ids: list[int]) -> torch.Tensor:
    """(h, n*h) with column blocks in config order -> the same map with blocks in ascending layer order."""
    n = len(aux_layer_ids)
    blocks = fc_weight.chunk(n, dim=1)  # n x (h, h)
    return torch.cat([blocks[j] for j in engine_order(aux_layer_ids)], dim=1)


def engine_tensors(state: dict[str, torch.Tensor], config: HeadConfig, *, layer_prefix: str) -> dict[str, torch.Tensor]:
    """The native head's state dict as the engines store it: the layer renamed, fc's column blocks (and the norms
    before fc) in ascending aux-layer order."""
    out = eagle_tensors(state, config, native_prefix=NATIVE_LAYER, layer_prefix=layer_prefix)
    aux = list(config.aux_layer_ids)
    out["fc.weight"] = fc_in_engine_order(out["fc.weight"], aux).contiguous()
    if "input_norm.weight" in out:  # per-element weight over the same blocks as fc's input
        blocks = out["input_norm.weight"].chunk(len(aux))
        out["input_norm.weight"] = torch.cat([blocks[j] for j in engine_order(aux)]).contiguous()
    if config.fc_norm:
        norms = [state[f"fc_norm.{j}.weight"].detach().to("cpu").contiguous() for j in engine_order(aux)]
        out.update({f"fc_norm.{i}.weight": w for i, w in enumerate(norms)})
    return out


def expected_tensors(config: HeadConfig, text: dict, *, layer_prefix: str
                     ) -> dict[str, tuple[tuple[int, ...], torch.dtype | None]]:
    """Name -> (shape, dtype) an engine loads for an EAGLE-3 head, from the target's config (`text`)."""
    h, vocab = int(text["hidden_size"]), int(text["vocab_size"])
    shapes = expected_layer_tensors(text, layer_prefix=layer_prefix, fc_inputs=NUM_AUX, fused_input=True,
                                    fc_bias=False)
    if config.norm_before_fc:
        shapes["input_norm.weight"] = ((NUM_AUX * h,), None)
    if config.fc_norm:
        shapes.update({f"fc_norm.{i}.weight": ((h,), None) for i in range(NUM_AUX)})
    shapes["norm.weight"] = ((h,), None)
    shapes["lm_head.weight"] = ((config.draft_vocab_size, h), None)
    if config.uses_draft_vocab:  # never with the full vocabulary (see eagle_tensors)
        shapes["d2t"] = ((config.draft_vocab_size,), torch.long)
        shapes["t2d"] = ((vocab,), torch.bool)
    return shapes


def read_eagle3(config: dict, tensors: dict, *, where: str, engine: str, num_layers: int, ids_key: str,
                layer_source: dict, norm_before_residual_default: bool) -> tuple[HeadConfig, dict]:
    """An EAGLE-3 folder read with `engine`'s flags, defaults and aux-layer convention."""
    if get_field(config, "norm_before_residual", norm_before_residual_default):
        raise ExportError(f"{where}: norm_before_residual is true ({engine} then adds the NORMED fused state as the "
                          f"residual); draftsmith heads add the un-normed one: expected false")
    # both engines read norm_before_fc from eagle_config first, then the top level; fc_norm and norm_output from
    # the top level only
    norms = {"norm_before_fc": bool(get_field(config, "eagle_config.norm_before_fc",
                                              get_field(config, "norm_before_fc", False))),
             "fc_norm": bool(get_field(config, "fc_norm", False)),
             "norm_output": bool(get_field(config, "norm_output", False))}
    if norms["norm_before_fc"] and norms["fc_norm"]:
        raise ExportError(f"{where}: norm_before_fc and fc_norm are both true; the engines take one or the other")
    if not get_field(config, "eagle_config.use_aux_hidden_state", True):
        raise ExportError(f"{where}: eagle_config.use_aux_hidden_state is false; expected true (fc over aux layers)")
    raw = get_field(config, ids_key, None) or engine_default_layer_ids(engine, num_layers=num_layers)
    # Engines concatenate aux states in ascending layer order, whatever order the config lists.
    aux = sorted(from_engine_layer_ids(list(raw), engine, num_layers=num_layers))
    layer_vocab = int(layer_source["vocab_size"])
    draft_vocab = int(get_field(config, "draft_vocab_size", layer_vocab))
    target_hidden = int(get_field(config, "target_hidden_size", layer_source["hidden_size"]))
    if target_hidden != int(layer_source["hidden_size"]):
        raise ExportError(f"{where}: target_hidden_size {target_hidden} != hidden_size {layer_source['hidden_size']}; "
                          f"draftsmith heads share the target's width")
    head_config = read_eagle_config("eagle3", layer_source, draft_vocab_size=draft_vocab, aux_layer_ids=aux,
                                    input_layernorm=True, hidden_norm=True, **norms)
    state = {k: v for k, v in tensors.items() if k not in ("d2t", "t2d")}
    state.update(read_vocab_maps(tensors.get("d2t"), layer_vocab, draft_vocab, where=where))
    return head_config, state
