"""What the EAGLE heads' engine forms share (serve/methods/eagle1/export.py, serve/methods/eagle3/export.py): the
tensor renaming (writers), the expected layer tensors and Llama fields (validators), and the reading of an engine's
Llama layer config and vocabulary maps (readers)."""
from __future__ import annotations

import torch

from draftsmith.serve.drafters.draft_layer import draft_layer_config
from draftsmith.serve.drafters.head_config import HeadConfig
from draftsmith.serve.export.common import Expect, ExportError
from draftsmith.serve.export.llama_config import expected_layer_shapes


def eagle_tensors(state: dict[str, torch.Tensor], config: HeadConfig, *, native_prefix: str, layer_prefix: str,
                  zero_fc_bias: bool = False) -> dict[str, torch.Tensor]:
    """The native head's state dict with its decoder layer renamed for an engine.

    native_prefix / layer_prefix: what the head / the engine calls the decoder layer ("layers.0." / "midlayer").
    zero_fc_bias: add an all-zero fc.bias when the head has none (SGLang's EAGLE-1 fc always has a bias).
    d2t (int64 offsets) and t2d (bool) are written for a reduced draft vocabulary only: with the full one vLLM
    >= 0.30 has no d2t parameter and fails on the tensor ("no module or parameter named
    'draft_id_to_target_id'"), and every engine reads a missing d2t as identity.
    """
    vocab_maps = config.uses_draft_vocab
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
    if zero_fc_bias and "fc.bias" not in out:
        out["fc.bias"] = torch.zeros(out["fc.weight"].shape[0], dtype=out["fc.weight"].dtype)
    return out


def expected_layer_tensors(text: dict, *, layer_prefix: str, fc_inputs: int, fused_input: bool,
                           fc_bias: bool) -> dict[str, tuple[tuple[int, ...], torch.dtype | None]]:
    """Name -> (shape, dtype) an engine loads for an EAGLE head's fc and decoder layer, from the target's config.

    fc_inputs: the features fc concatenates (EAGLE-1: embedding and feature, 2; EAGLE-3: its aux layers).
    fused_input: the layer reads cat(normed embedding, normed fused state), 2h wide (EAGLE-3), rather than fc's
    output with no input norm (EAGLE-1)."""
    h = int(text["hidden_size"])
    layer = expected_layer_shapes(draft_layer_config(text), prefix=layer_prefix, qkv_in=2 * h if fused_input else h,
                                  input_layernorm=fused_input, hidden_norm=fused_input)
    shapes: dict[str, tuple[tuple[int, ...], torch.dtype | None]] = {k: (v, None) for k, v in layer.items()}
    shapes["fc.weight"] = ((h, fc_inputs * h), None)
    if fc_bias:
        shapes["fc.bias"] = ((h,), None)
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


def vllm_versions_note(architecture: str) -> str:
    """The README's version note of an EAGLE head served by vLLM's own draft class `architecture`."""
    return (f"vLLM versions: loaded and drafted with vLLM's own {architecture} in vLLM 0.32.0 and 0.33.0 "
            f"(scripts/check_engines.py).")
