"""Sweep axes and their parsing (`k=1,2,3` -> ("k", [1, 2, 3])): pure, so the config can check its `sweep` list
without importing the runner that runs it (eval/sweeps.py)."""
from __future__ import annotations

from typing import Sequence

from draftsmith.serve.core.errors import DraftsmithError

AXES: dict[str, type] = {"k": int, "temperature": float, "max_new_tokens": int, "top_p": float, "top_k": int,
                         "batch_size": int}


def parse_sweep(text: str) -> tuple[str, list]:
    """`"k=1,2,3"` -> ("k", [1, 2, 3])."""
    if "=" not in text:
        raise DraftsmithError(f"sweep {text!r} is not AXIS=v1,v2,... (axes: {', '.join(AXES)})")
    axis, raw = (s.strip() for s in text.split("=", 1))
    if axis not in AXES:
        raise DraftsmithError(f"unknown sweep axis {axis!r}; sweepable: {', '.join(AXES)}")
    try:
        values = [AXES[axis](v) for v in raw.split(",") if v.strip()]
    except ValueError:
        raise DraftsmithError(f"sweep {text!r}: values must be {AXES[axis].__name__}s, comma separated") from None
    if not values:
        raise DraftsmithError(f"sweep {text!r} has no values")
    if axis == "batch_size" and any(v < 1 for v in values):
        raise DraftsmithError(f"sweep {text!r}: batch sizes must be >= 1")
    return axis, values


def parse_sweeps(texts: Sequence[str]) -> list[tuple[str, list]]:
    return [parse_sweep(t) for t in texts]
