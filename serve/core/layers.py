"""The target contract every stage shares: which hidden state a layer id names (DESIGN.md).

id i  = the output of decoder layer i (0-based) = HF `hidden_states[i + 1]` (output_hidden_states=True);
FINAL = -1 = the last, normed state = `hidden_states[-1]`, what the lm_head reads (EAGLE-1 and Medusa use it).
HF's tuple ends with the normed state, so id n-1 reads the normed state too. Serving engines capture only
inputs of layers 0..n-1, so an EAGLE-3 aux layer must lie in 0..n-2 (serve/export/layer_ids.py says how each
engine numbers them).

The decoder, training (online features) and the capture of offline features all pick hidden states with
`pick_hidden_states`, so the three can never disagree on what an id means.
"""
from __future__ import annotations

from typing import Any, Sequence

from draftsmith.serve.core.errors import DraftsmithError

FINAL = -1  # key of the final (normed) hidden state in `hidden_states` dicts
# Written into every drafter config and cache manifest, so readers (and exports) know how to translate.
CONVENTION = "draftsmith: id i = output of decoder layer i = HF hidden_states[i+1]; -1 = final normed state"
EAGLE3_NUM_AUX = 3  # vLLM and SGLang size EAGLE-3's fc as 3 * hidden: exactly three aux layers
# Three distinct aux layers below the last one (whose output no engine captures) need four layers.
EAGLE3_MIN_LAYERS = EAGLE3_NUM_AUX + 1


def hidden_state_index(layer: int) -> int:
    """A layer id -> its index in HF's `hidden_states` tuple."""
    return -1 if layer == FINAL else layer + 1


def pick_hidden_states(hidden_states: Sequence, layers: Sequence[int]) -> dict:
    """HF's `hidden_states` tuple ((n + 1) x (B, T, h)) -> {layer id: (B, T, h)} for `layers`."""
    return {layer: hidden_states[hidden_state_index(layer)] for layer in layers}


def published_eagle3_layers(num_layers: int) -> list[int]:
    """EAGLE-3's published low/mid/high layers in our convention: outputs of 1, n//2-1, n-4 (= the inputs of
    layers 2, n//2, n-3, what vLLM and SGLang capture when a config names none). They collide below 7 layers."""
    n = num_layers
    return [1, n // 2 - 1, n - 4]


def default_eagle3_layers(num_layers: int) -> list[int]:
    """The aux layers EAGLE-3 reads when none are named: the published ones, and on 4..6-layer targets (where
    those collide) the nearest distinct ids below the last layer. Distinct and servable at every depth it allows."""
    n = num_layers
    if n < EAGLE3_MIN_LAYERS:
        raise DraftsmithError(f"EAGLE-3 reads {EAGLE3_NUM_AUX} distinct aux layers below the last decoder layer "
                              f"(serving engines cannot capture its output), so it needs a target of at least "
                              f"{EAGLE3_MIN_LAYERS} layers; this one has {n}: train eagle1 or medusa instead")
    low = min(1, n - 4)
    high = max(n - 4, low + 2)
    mid = min(max(n // 2 - 1, low + 1), high - 1)
    return [low, mid, high]


def aux_layers_or_default(layer_ids: Sequence[int] | None, num_layers: int, *, title: str) -> list[int]:
    """The aux layers a head of `title` reads: the given ids, each inside 0..n-1, or EAGLE-3's default three."""
    aux = [int(i) for i in layer_ids] if layer_ids else default_eagle3_layers(num_layers)
    bad = [i for i in aux if not 0 <= i < num_layers]
    if bad:
        raise DraftsmithError(f"{title} aux layer ids {bad} are outside 0..{num_layers - 1} for this "
                              f"{num_layers}-layer target (ids are outputs of decoder layers, 0-based)")
    return aux


def check_eagle3_layers(layer_ids: Sequence[int], num_layers: int | None = None, *,
                        key: str = "model.aux_layer_ids") -> list[int]:
    """Refuse EAGLE-3 aux layers that no serving engine could load: not exactly three, repeated, or (when the
    target's depth is known) outside 0..n-2. Returns them as a list."""
    ids = [int(i) for i in layer_ids]
    if len(ids) != EAGLE3_NUM_AUX:
        raise DraftsmithError(f"{key}={ids}: EAGLE-3 reads exactly {EAGLE3_NUM_AUX} aux layers (the engines' fc "
                              f"is {EAGLE3_NUM_AUX}*hidden wide); name three or leave it empty for the default")
    if len(set(ids)) != len(ids):
        raise DraftsmithError(f"{key}={ids} repeats a layer; engines capture each layer once, so the fc input "
                              f"would be short: name {EAGLE3_NUM_AUX} distinct layers")
    if num_layers is not None:
        bad = [i for i in ids if not 0 <= i <= num_layers - 2]
        if bad:
            raise DraftsmithError(f"{key}={ids}: {bad} outside 0..{num_layers - 2} for this {num_layers}-layer "
                                  f"target (ids are outputs of decoder layers; engines cannot capture the output "
                                  f"of the last one, {num_layers - 1})")
    return ids


def hidden_states_at(decoder: Any, layers: Sequence[int], **inputs: Any) -> dict:
    """The decoder's hidden states at `layers` (same ids and values as pick_hidden_states on HF's tuple), keeping
    only those: forward hooks on the named decoder layers instead of `output_hidden_states`, which holds all n + 1
    states of the batch at once (81 x tokens x hidden for a 70B target). {layer id: (B, T, h)}."""
    blocks = getattr(decoder, "layers", None)
    if blocks is None:  # a decoder without a `layers` list: HF's tuple
        out = decoder(**inputs, output_hidden_states=True, use_cache=False)
        return pick_hidden_states(out.hidden_states, layers)
    last = len(blocks) - 1
    hooked = sorted({i for i in layers if i != FINAL and i < last})  # id n-1 reads the normed state, as HF's tuple
    kept: dict = {}

    def keeper(layer: int):
        def keep(module, args, output):
            kept[layer] = output[0] if isinstance(output, tuple) else output
        return keep

    handles = [blocks[i].register_forward_hook(keeper(i)) for i in hooked]
    try:
        out = decoder(**inputs, use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    return {layer: kept[layer] if layer in kept else out.last_hidden_state for layer in layers}
