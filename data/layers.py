"""Which hidden states a capture stores for a drafter, in the layer-id convention of serve/core/layers.py
(FINAL, the last normed state, is always stored: the losses recompute the target's logits from it)."""
from __future__ import annotations

from dataclasses import dataclass

from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.core.layers import CONVENTION, FINAL
from draftsmith.serve.methods import registry

__all__ = ["CONVENTION", "LayerSpec", "resolve_layers"]


@dataclass(frozen=True)
class LayerSpec:
    spec: str  # what the user asked for
    aux_layer_ids: tuple[int, ...]  # the drafter's feature layers in its order (EAGLE-3: low, mid, high)
    stored: tuple[int, ...]  # ids written to the cache: unique, ascending, FINAL last (always present)


def resolve_layers(spec: str, num_layers: int) -> LayerSpec:
    """A registered method's name (its layer set: `eagle3`, `eagle1`, `medusa`, ...) | comma-separated ids (e.g.
    `1,14,26`, `-1`) -> LayerSpec."""
    text = str(spec).strip().lower()
    method = registry.find(text)
    if method is not None and method.layers is not None:
        aux = tuple(method.layers(num_layers))
    else:
        try:
            aux = tuple(int(part) for part in text.split(",") if part.strip())
        except ValueError:
            names = ", ".join(registry.names(trained=True))
            raise DraftsmithError(f"layers {spec!r}: expected a method's name ({names}) or comma-separated layer ids "
                                  f"(0..{num_layers - 1}, -1 = final normed state)") from None
        if not aux:
            raise DraftsmithError(f"layers {spec!r} names no layer")
    bad = [i for i in aux if i != FINAL and not 0 <= i < num_layers]
    if bad:
        raise DraftsmithError(f"layer ids {bad} are outside 0..{num_layers - 1} for this {num_layers}-layer target "
                              f"(-1 = final normed state)")
    stored = tuple(sorted({i for i in aux if i != FINAL})) + (FINAL,)
    return LayerSpec(spec=text, aux_layer_ids=aux, stored=stored)
