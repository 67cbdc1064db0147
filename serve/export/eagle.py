"""EAGLE heads as the engines store them: tensor mapping (writers), expected tensors/fields (validators) and the
engine-faithful reading of an EAGLE-3 folder (readers); each format module adds its own names and defaults.

Two engine facts shape the EAGLE-3 mapping (vLLM llama.py and SGLang llama.py alike):
- the target appends aux hidden states while looping over its layers, `if idx in aux_layers`, so the fc input
  is the concatenation in ASCENDING layer order whatever order the config lists; our head concatenates in
  its config order, so the exporter permutes fc.weight's column blocks to ascending order;
- membership is a set test, so a layer listed twice is captured once and the fc input is short: refused.
"""
from __future__ import annotations

import torch

from draftsmith.serve.drafters.draft_layer import draft_layer_config
from draftsmith.serve.drafters.head_config import HeadConfig
from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.export.common import ABSENT, Expect, ExportError, get_field
from draftsmith.serve.export.layer_ids import engine_default_layer_ids, from_engine_layer_ids
from draftsmith.serve.export.llama_config import check_llama_like, expected_layer_shapes, rope_fields
from draftsmith.serve.core.layers import EAGLE3_NUM_AUX as NUM_AUX  # vLLM and SGLang size fc as 3 * target_hidden_size
from draftsmith.serve.core.layers import FINAL


def check_eagle_exportable(config: HeadConfig, fmt: str) -> None:
    check_llama_like(config, fmt)
    if config.method == "eagle1" and config.input_layernorm:
        raise DraftsmithError(f"--format {fmt}: the engines' EAGLE-1 layer skips layers.0.input_layernorm, but this "
                              f"drafter was trained with it (input_layernorm=true)")
    if config.method == "eagle3":
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


# EAGLE-3 norms before fc, as the engines name them (vLLM llama_eagle3.py, SGLang llama_eagle3.py, speculators
# Eagle3DraftModel): `norm_before_fc` = one RMSNorm over the concatenated aux states, tensor `input_norm.weight`
# (n*h,); `fc_norm` = one RMSNorm per aux state, tensors `fc_norm.{i}.weight` (h,). The first releases that read
# each flag, per format (from every release's source): below them the tensor is dropped silently, a wrong model.
FEATURE_NORM_FIRST = {
    "vllm": {"norm_before_fc": (0, 18), "fc_norm": (0, 22)},
    "speculators": {"norm_before_fc": (0, 19), "fc_norm": (0, 25)},  # through vLLM's speculators reader
    "sglang": {"norm_before_fc": (0, 5, 18), "fc_norm": (0, 5, 15)},
}


def feature_norms(config: HeadConfig) -> dict[str, bool]:
    """The head's norms before fc as engine config flags."""
    return {"norm_before_fc": bool(config.norm_before_fc), "fc_norm": bool(config.fc_norm)}


def first_release_for(config: HeadConfig, fmt: str):
    """The oldest release of the format's engine that reads every norm this head has (None: no norm)."""
    firsts = [FEATURE_NORM_FIRST[fmt][flag] for flag, on in feature_norms(config).items() if on]
    return max(firsts) if firsts else None


def feature_norm_support(config: HeadConfig, fmt: str, engine: str):
    """engines.Support for a head with norms before fc (None: it has none, the format's own range holds)."""
    from draftsmith.serve.export.engines import Support

    first = first_release_for(config, fmt)
    if first is None:
        return None
    return Support(engine, first, why="older releases have no norm before fc and drop its weights silently",
                   fix="Use a newer release, or retrain without model.fc_norm / model.norm_before_fc.")


def feature_norm_fields(config: HeadConfig, *, prefix: str = "") -> dict[str, Expect]:
    """The config flags of the head's norms before fc; false may also be left out (every engine defaults it)."""
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


def eagle_tensors(state: dict[str, torch.Tensor], config: HeadConfig, *, layer_prefix: str,
                  zero_fc_bias: bool = False) -> dict[str, torch.Tensor]:
    """The native head's state dict renamed and reordered for an engine.

    layer_prefix: what the engine calls the decoder layer ("layers.0" / "midlayer").
    zero_fc_bias: add an all-zero fc.bias when the head has none (SGLang's EAGLE-1 fc always has a bias).
    d2t (int64 offsets) and t2d (bool) are written for a reduced draft vocabulary only: with the full one vLLM
    >= 0.30 has no d2t parameter and fails on the tensor ("no module or parameter named
    'draft_id_to_target_id'"), and every engine reads a missing d2t as identity.
    """
    vocab_maps = config.uses_draft_vocab
    native_prefix = "layers.0." if config.method == "eagle1" else "midlayer."
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        tensor = tensor.detach().to("cpu").contiguous()
        if name in ("d2t", "t2d"):
            if vocab_maps:
                out[name] = tensor.to(torch.long if name == "d2t" else torch.bool)
            continue
        if name.startswith(native_prefix):
            name = f"{layer_prefix}.{name[len(native_prefix):]}"
        out[name] = tensor
    if config.method == "eagle3":
        aux = list(config.aux_layer_ids)
        out["fc.weight"] = fc_in_engine_order(out["fc.weight"], aux).contiguous()
        if "input_norm.weight" in out:  # per-element weight over the same blocks as fc's input
            blocks = out["input_norm.weight"].chunk(len(aux))
            out["input_norm.weight"] = torch.cat([blocks[j] for j in engine_order(aux)]).contiguous()
        if config.fc_norm:
            norms = [state[f"fc_norm.{j}.weight"].detach().to("cpu").contiguous() for j in engine_order(aux)]
            out.update({f"fc_norm.{i}.weight": w for i, w in enumerate(norms)})
    if zero_fc_bias and "fc.bias" not in out:
        out["fc.bias"] = torch.zeros(out["fc.weight"].shape[0], dtype=out["fc.weight"].dtype)
    return out


def expected_eagle_tensors(config: HeadConfig, text: dict, *, layer_prefix: str,
                           fc_bias: bool) -> dict[str, tuple[tuple[int, ...], torch.dtype | None]]:
    """Name -> (shape, dtype) an engine loads for an EAGLE head, from the target's config (`text`)."""
    h, vocab = int(text["hidden_size"]), int(text["vocab_size"])
    eagle3 = config.method == "eagle3"
    layer = expected_layer_shapes(draft_layer_config(text), prefix=layer_prefix, qkv_in=2 * h if eagle3 else h,
                                  input_layernorm=eagle3, hidden_norm=eagle3)
    shapes: dict[str, tuple[tuple[int, ...], torch.dtype | None]] = {k: (v, None) for k, v in layer.items()}
    shapes["fc.weight"] = ((h, (NUM_AUX if eagle3 else 2) * h), None)
    if fc_bias:
        shapes["fc.bias"] = ((h,), None)
    if eagle3:
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


def expected_llama_fields(text: dict, *, prefix: str = "") -> dict[str, Expect]:
    """The Llama config fields the engines build the draft layer from: the draft layer draftsmith derives from the
    target's text config `text` (serve/drafters/draft_layer.py)."""
    layer = draft_layer_config(text)
    fields = {
        "model_type": Expect("llama", "the engines build the draft layer as a Llama layer"),
        "hidden_size": Expect(layer["hidden_size"]),
        "vocab_size": Expect(layer["vocab_size"], "the target's vocabulary"),
        "intermediate_size": Expect(layer["intermediate_size"]),
        "num_attention_heads": Expect(layer["num_attention_heads"]),
        "num_key_value_heads": Expect(layer["num_key_value_heads"], "vLLM keeps one KV-cache layout for target "
                                                                    "and draft"),
        "head_dim": Expect(layer["head_dim"], "vLLM keeps one KV-cache layout for target and draft"),
        "num_hidden_layers": Expect(1, "one draft decoder layer"),
        "rms_norm_eps": Expect(layer["rms_norm_eps"]),
        "hidden_act": Expect(layer["hidden_act"], "the engines' Llama MLP runs silu alone"),
        "rope_theta": Expect(layer["rope_parameters"]["rope_theta"], "engines reading transformers-4 configs default "
                                                                     "a missing rope_theta to 10000"),
        "tie_word_embeddings": Expect(False, "tied, SGLang would use the embedding matrix as the draft lm_head"),
        "attention_bias": Expect(False, "the engines' draft q/k/v/o have no bias"),
    }
    return {prefix + k: v for k, v in fields.items()}


# ------------------------------------------------------------------------------------------------ readers

_LAYER_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
               "head_dim", "hidden_act", "max_position_embeddings", "rms_norm_eps", "attention_bias", "mlp_bias",
               "rope_theta", "rope_scaling", "bos_token_id", "eos_token_id", "pad_token_id")


def read_eagle_config(method: str, layer_source: dict, **fields) -> HeadConfig:
    """The HeadConfig of the Llama EAGLE layer an engine builds from a config dict (its own keys only)."""
    layer = {k: layer_source[k] for k in _LAYER_KEYS if k in layer_source}
    layer.update(model_type="llama", num_hidden_layers=1)
    vocab = int(layer["vocab_size"])
    return HeadConfig(method=method, model_type="llama", hidden_size=int(layer["hidden_size"]), vocab_size=vocab,
                      draft_vocab_size=int(fields.pop("draft_vocab_size", vocab)), layer_config=layer, **fields)


def read_eagle1(config: dict, tensors: dict, *, fc_bias: bool) -> tuple[HeadConfig, dict]:
    """EAGLE-1 as both engines build it: layer 0 without input_layernorm, fc bias as the engine builds it."""
    state = {k: v for k, v in tensors.items() if "input_layernorm" not in k and (fc_bias or k != "fc.bias")}
    return read_eagle_config("eagle1", config, aux_layer_ids=[FINAL], input_layernorm=False, fc_bias=fc_bias), state


def rename_prefix(tensors: dict, old: str, new: str) -> dict:
    return {(new + k[len(old):] if k.startswith(old) else k): v for k, v in tensors.items()}


def read_vocab_maps(d2t: torch.Tensor | None, vocab: int, draft_vocab: int, *, where: str) -> dict:
    """d2t as the engines use it (target = draft + d2t); absent means identity offsets; t2d rebuilt from d2t."""
    if d2t is None:
        if draft_vocab != vocab:
            raise ExportError(f"{where}: tensor 'd2t' is missing with draft_vocab_size {draft_vocab} < vocab_size "
                              f"{vocab}: draft ids would be read as target ids")
        d2t = torch.zeros(draft_vocab, dtype=torch.long)
    d2t = d2t.to(torch.long)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[torch.arange(d2t.numel()) + d2t] = True
    return {"d2t": d2t, "t2d": t2d}


def read_eagle3(config: dict, tensors: dict, *, where: str, engine: str, num_layers: int, ids_key: str,
                layer_source: dict, norm_before_residual_default: bool) -> tuple[HeadConfig, dict]:
    """An EAGLE-3 folder read with `engine`'s flags, defaults and aux-layer convention."""
    if get_field(config, "norm_before_residual", norm_before_residual_default):
        raise ExportError(f"{where}: norm_before_residual is true ({engine} then adds the NORMED fused state as the "
                          f"residual); draftsmith heads add the un-normed one: expected false")
    if get_field(config, "norm_output", False):
        raise ExportError(f"{where}: norm_output is true; draftsmith heads feed back un-normed states: expected false")
    # both engines read norm_before_fc from eagle_config first, then the top level; fc_norm from the top level only
    norms = {"norm_before_fc": bool(get_field(config, "eagle_config.norm_before_fc",
                                              get_field(config, "norm_before_fc", False))),
             "fc_norm": bool(get_field(config, "fc_norm", False))}
    if all(norms.values()):
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
