"""Aux-layer ids in each serving engine's convention: the pure translation and where each convention comes from.

An EAGLE-3 drafter reads the target's hidden states at a few layers. Everybody numbers them differently:

- draftsmith (DESIGN.md): id i = the OUTPUT of decoder layer i (0-based) = HF `hidden_states[i + 1]`.
- vLLM: the target records `hidden_states + residual` *before* running layer idx when `idx in
  aux_hidden_state_layers` (vllm/model_executor/models/llama.py, `LlamaModel.forward`), so id i = the INPUT of
  layer i = HF `hidden_states[i]`. The ids come from the draft config's top-level
  `eagle_aux_hidden_state_layer_ids` (vllm/v1/spec_decode `get_eagle3_aux_layers_from_config`); the default is
  `(2, n // 2, n - 3)` (`get_eagle3_aux_hidden_state_layers`). Only inputs of layers 0..n-1 are captured.
- speculators (vllm-project/speculators): the same ids vLLM reads (it writes the top-level
  `eagle_aux_hidden_state_layer_ids` vLLM consumes; `resolve_target_layer_ids` defaults to
  `[2, n // 2, n - 3]`), so the vLLM convention.
- SGLang: the draft config's `eagle_config.eagle_aux_hidden_state_layer_ids` are passed to the target's
  `set_eagle3_layers_to_capture(layer_ids)`, which stores `[val + 1 for val in layer_ids]` ("we plus 1 here
  because in sglang, for the ith layer, it takes the output of the (i-1)th layer as aux hidden state",
  python/sglang/srt/models/llama.py); capture then happens before layer `val + 1`. So SGLang's config ids
  are layer OUTPUTS: the draftsmith convention. Its default capture set is `[2, n // 2, n - 3]` (layer inputs).

Both engines capture only inputs of layers 0..n-1, so the output of the last decoder layer (our id n-1)
cannot be served; the final normed state (our FINAL = -1) is not an aux layer at all.
"""
from __future__ import annotations

from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.core.layers import CONVENTION, FINAL, published_eagle3_layers

ENGINES = ("draftsmith", "vllm", "sglang", "speculators")
# engine id = draftsmith id + offset
_OFFSET = {"draftsmith": 0, "vllm": 1, "speculators": 1, "sglang": 0}
CONVENTIONS = {
    "draftsmith": CONVENTION,
    "vllm": "id i = input of decoder layer i = HF hidden_states[i] (vllm llama.py aux_hidden_state_layers)",
    "speculators": "id i = input of decoder layer i = HF hidden_states[i] (read by vLLM as is)",
    "sglang": "id i = output of decoder layer i = HF hidden_states[i+1] (SGLang captures before layer i+1)",
}


def _check_engine(engine: str) -> None:
    if engine not in _OFFSET:
        raise DraftsmithError(f"unknown layer-id convention {engine!r}; choose one of {', '.join(ENGINES)}")


def to_engine_layer_ids(layer_ids: list[int], engine: str, *, num_layers: int) -> list[int]:
    """Our aux-layer ids -> the ids `engine` must find in its config to capture the same hidden states."""
    _check_engine(engine)
    bad = [i for i in layer_ids if not 0 <= i < num_layers]
    if bad:
        raise DraftsmithError(f"aux layer ids {bad} are outside 0..{num_layers - 1} for a {num_layers}-layer target "
                              f"(draftsmith ids are outputs of decoder layers; FINAL=-1 is not an aux layer)")
    last = [i for i in layer_ids if i == num_layers - 1]
    if last and engine != "draftsmith":
        raise DraftsmithError(f"aux layer id {num_layers - 1} (output of the last decoder layer) cannot be captured by "
                              f"{engine}: engines record inputs of layers 0..{num_layers - 1} only; retrain with "
                              f"model.aux_layer_ids below {num_layers - 1}")
    return [i + _OFFSET[engine] for i in layer_ids]


def from_engine_layer_ids(layer_ids: list[int], engine: str, *, num_layers: int) -> list[int]:
    """Ids read from an `engine` config -> our convention (inverse of `to_engine_layer_ids`)."""
    _check_engine(engine)
    ours = [int(i) - _OFFSET[engine] for i in layer_ids]
    bad = [e for e, o in zip(layer_ids, ours) if not 0 <= o < num_layers]
    if bad:
        raise DraftsmithError(f"{engine} aux layer ids {bad} do not name an output of a decoder layer of this "
                              f"{num_layers}-layer target ({CONVENTIONS[engine]})")
    return ours


def engine_default_layer_ids(engine: str, *, num_layers: int) -> list[int]:
    """What `engine` captures when its config names no aux layers, in the engine's own convention."""
    _check_engine(engine)
    published = [i + 1 for i in published_eagle3_layers(num_layers)]  # [2, n//2, n-3]: inputs of layers
    if engine == "draftsmith":
        return from_engine_layer_ids(published, "vllm", num_layers=num_layers)
    if engine == "sglang":
        # SGLang's default list is stored as capture indices (layer inputs) directly, not shifted by one.
        return [i - 1 for i in published]
    return published


def aux_layer_ids_for(config, engine: str, num_layers: int) -> list[int] | None:
    """An EAGLE-3 head's aux layer ids (sorted, as the engines collect them) in `engine`'s convention;
    None for methods without aux layers. `config` is a draftsmith.serve.drafters.head_config.HeadConfig."""
    if FINAL in config.aux_layer_ids:  # a head of the final state alone (EAGLE-1, Medusa): no aux layers
        return None
    return to_engine_layer_ids(sorted(config.aux_layer_ids), engine, num_layers=num_layers)
