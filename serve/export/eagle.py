"""EAGLE heads as the engines store them: tensor mapping (writers) and expected tensors/fields (validators).

Two engine facts shape the EAGLE-3 mapping (vLLM llama.py and SGLang llama.py alike):
- the target appends aux hidden states while looping over its layers, `if idx in aux_layers`, so the fc input
  is the concatenation in ASCENDING layer order whatever order the config lists; our head concatenates in
  its config order, so the exporter permutes fc.weight's column blocks to ascending order;
- membership is a set test, so a layer listed twice is captured once and the fc input is short: refused.
"""
from __future__ import annotations

import torch

from serve.drafters.heads_common import HeadConfig, text_config_of
from serve.errors import DraftsmithError
from serve.export.common import Expect
from serve.export.llama_config import check_llama_like, expected_layer_shapes, rope_fields

NUM_AUX = 3  # vLLM and SGLang size fc as 3 * target_hidden_size


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


def engine_order(aux_layer_ids: list[int]) -> list[int]:
    """Positions of the aux ids in ascending layer order: the order engines concatenate the aux states in."""
    return sorted(range(len(aux_layer_ids)), key=lambda j: aux_layer_ids[j])


def fc_in_engine_order(fc_weight: torch.Tensor, aux_layer_ids: list[int]) -> torch.Tensor:
    """(h, n*h) with column blocks in config order -> the same map with blocks in ascending layer order."""
    n = len(aux_layer_ids)
    blocks = fc_weight.chunk(n, dim=1)  # n x (h, h)
    return torch.cat([blocks[j] for j in engine_order(aux_layer_ids)], dim=1)


def eagle_tensors(state: dict[str, torch.Tensor], config: HeadConfig, *, layer_prefix: str, vocab_maps: bool,
                  zero_fc_bias: bool = False) -> dict[str, torch.Tensor]:
    """The native head's state dict renamed and reordered for an engine.

    layer_prefix: what the engine calls the decoder layer ("layers.0" / "midlayer").
    vocab_maps:   write d2t (int64 offsets) and t2d (bool) for EAGLE-3.
    zero_fc_bias: add an all-zero fc.bias when the head has none (SGLang's EAGLE-1 fc always has a bias).
    """
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
        out["fc.weight"] = fc_in_engine_order(out["fc.weight"], list(config.aux_layer_ids)).contiguous()
    if zero_fc_bias and "fc.bias" not in out:
        out["fc.bias"] = torch.zeros(out["fc.weight"].shape[0], dtype=out["fc.weight"].dtype)
    return out


def target_text_config(target) -> dict:
    return text_config_of(target.config).to_dict()


def expected_eagle_tensors(config: HeadConfig, text: dict, *, layer_prefix: str, fc_bias: bool,
                           vocab_maps: bool) -> dict[str, tuple[tuple[int, ...], torch.dtype | None]]:
    """Name -> (shape, dtype) an engine loads for an EAGLE head, from the target's config (`text`)."""
    h, vocab = int(text["hidden_size"]), int(text["vocab_size"])
    eagle3 = config.method == "eagle3"
    layer = expected_layer_shapes(text, prefix=layer_prefix, qkv_in=2 * h if eagle3 else h,
                                  input_layernorm=eagle3, hidden_norm=eagle3)
    shapes: dict[str, tuple[tuple[int, ...], torch.dtype | None]] = {k: (v, None) for k, v in layer.items()}
    shapes["fc.weight"] = ((h, (NUM_AUX if eagle3 else 2) * h), None)
    if fc_bias:
        shapes["fc.bias"] = ((h,), None)
    if eagle3:
        shapes["norm.weight"] = ((h,), None)
        shapes["lm_head.weight"] = ((config.draft_vocab_size, h), None)
        if vocab_maps:
            shapes["d2t"] = ((config.draft_vocab_size,), torch.long)
            shapes["t2d"] = ((vocab,), torch.bool)
    return shapes


def expected_llama_fields(text: dict, *, prefix: str = "") -> dict[str, Expect]:
    """The Llama config fields the engines build the draft layer from, equal to the target's."""
    heads = int(text["num_attention_heads"])
    fields = {
        "model_type": Expect("llama", "the engines build the draft layer as a Llama layer"),
        "hidden_size": Expect(int(text["hidden_size"])),
        "vocab_size": Expect(int(text["vocab_size"]), "the target's vocabulary"),
        "intermediate_size": Expect(int(text["intermediate_size"])),
        "num_attention_heads": Expect(heads),
        "num_key_value_heads": Expect(int(text.get("num_key_value_heads") or heads)),
        "head_dim": Expect(int(text.get("head_dim") or int(text["hidden_size"]) // heads)),
        "num_hidden_layers": Expect(1, "one draft decoder layer"),
        "rms_norm_eps": Expect(float(text["rms_norm_eps"])),
        "hidden_act": Expect(text.get("hidden_act", "silu")),
        "rope_theta": Expect(rope_fields(text)["rope_theta"], "engines reading transformers-4 configs default "
                                                              "a missing rope_theta to 10000"),
        "tie_word_embeddings": Expect(False, "tied, SGLang would use the embedding matrix as the draft lm_head"),
        "attention_bias": Expect(False, "the engines' draft q/k/v/o have no bias"),
    }
    return {prefix + k: v for k, v in fields.items()}
