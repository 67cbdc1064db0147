"""Which hidden states a drafter trains on, in the layer-id convention of DESIGN.md.

id i = the output of decoder layer i = HF `hidden_states[i + 1]`; FINAL (-1) = the last, normed state
(`hidden_states[-1]`, what the lm_head reads; the losses recompute the target's logits from it).
Note that HF's tuple ends with the normed state, so id n-1 also reads the normed state.
"""
from __future__ import annotations

from dataclasses import dataclass

from serve.drafters.base import FINAL
from serve.errors import DraftsmithError

CONVENTION = ("ours: id i = output of decoder layer i = HF hidden_states[i+1]; "
              "-1 = final normed state = HF hidden_states[-1]")
LAYER_SETS = ("eagle3", "eagle1", "medusa")


@dataclass(frozen=True)
class LayerSpec:
    spec: str  # what the user asked for
    aux_layer_ids: tuple[int, ...]  # the drafter's feature layers in its order (EAGLE-3: low, mid, high)
    stored: tuple[int, ...]  # ids written to the cache: unique, ascending, FINAL last (always present)


def eagle3_layers(num_layers: int) -> list[int]:
    from serve.drafters.eagle3 import default_aux_layers

    return default_aux_layers(num_layers)


def resolve_layers(spec: str, num_layers: int) -> LayerSpec:
    """`eagle3` | `eagle1` | `medusa` | comma-separated ids (e.g. `1,14,26`, `-1`) -> LayerSpec."""
    text = str(spec).strip().lower()
    if text == "eagle3":
        aux = tuple(eagle3_layers(num_layers))
    elif text in ("eagle1", "medusa"):
        aux = (FINAL,)
    else:
        try:
            aux = tuple(int(part) for part in text.split(",") if part.strip())
        except ValueError:
            raise DraftsmithError(f"layers {spec!r}: expected {', '.join(LAYER_SETS)} or comma-separated layer ids "
                                  f"(0..{num_layers - 1}, -1 = final normed state)") from None
        if not aux:
            raise DraftsmithError(f"layers {spec!r} names no layer")
    bad = [i for i in aux if i != FINAL and not 0 <= i < num_layers]
    if bad:
        raise DraftsmithError(f"layer ids {bad} are outside 0..{num_layers - 1} for this {num_layers}-layer target "
                              f"(-1 = final normed state)")
    stored = tuple(sorted({i for i in aux if i != FINAL})) + (FINAL,)
    return LayerSpec(spec=text, aux_layer_ids=aux, stored=stored)
