"""Drafters to evaluate: building them from `name=spec` pairs (the spec grammar is serve/drafters/spec.py's)
and what the report says about each (name, kind, path, tree).

A spec ending in `@tree` drafts trees (EAGLE-2 dynamic trees by default; `@tree:depth=5,top_k=4,total_tokens=24`
sets them); EAGLE and Medusa heads support trees, so `--drafter e3=DIR --drafter e3-tree=DIR@tree` compares both."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Mapping

from draftsmith.serve.drafters.settings import describe_tree
from draftsmith.serve.drafters.spec import parse_drafter_spec, spec_path
from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.methods.registry import has
from draftsmith.serve.core.target import Target

BASELINE = "plain"  # the name of plain decoding in results and records
RESERVED_NAMES = (BASELINE,)


@dataclass
class DrafterEntry:
    name: str
    kind: str
    path: str | None  # the drafter's folder or model path, None for ngram / oracle
    spec: str | None  # what the user passed, None when given a built drafter
    drafter: Any  # a draftsmith.serve.drafters.base.Drafter
    tree: Any = None  # a draftsmith.serve.tree.TreeSpec: this entry drafts trees

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "path": self.path, "spec": self.spec,
                "tree": describe_tree(self.tree)}


def length_policy(drafter: Any) -> str:
    """How the drafter chooses its draft length: `auto` (per step), `fixed` (K), `min_confidence=x`."""
    policy = getattr(drafter, "policy", None)
    if policy is None:
        return "fixed"
    if policy.name == "min_confidence":
        return f"min_confidence={policy.threshold:g}"
    return policy.name


class BeginTimed:
    """Proxy of a drafter that times its `begin`, so free precomputation (the oracle's) can be kept out of
    its measured speed; everything else goes to the wrapped drafter."""

    def __init__(self, drafter: Any):
        self.inner = drafter
        self.begin_seconds = 0.0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def begin(self, *args: Any, **kwargs: Any) -> None:
        start = time.perf_counter()
        self.inner.begin(*args, **kwargs)
        self.begin_seconds = time.perf_counter() - start


def build_entries(target: Target, drafters: Mapping[str, Any], *, max_new_tokens: int) -> list[DrafterEntry]:
    """Build every drafter against `target`; a value is a spec string or an already built Drafter.

    max_new_tokens: the longest generation of the run (the oracle precomputes that many tokens).
    """
    from draftsmith.serve.drafters import build_drafter

    entries = []
    for name, value in drafters.items():
        if name in RESERVED_NAMES or not name.strip():
            raise DraftsmithError(f"drafter name {name!r} is reserved for the baseline or empty; pick another")
        if isinstance(value, str):
            parsed = parse_drafter_spec(value)
            opts = {"max_new_tokens": max_new_tokens} if has(parsed.kind, "ceiling") else {}
            drafter = build_drafter(parsed, target, **opts)
            entries.append(DrafterEntry(name=name, kind=str(drafter.kind), path=spec_path(value), spec=value,
                                        drafter=drafter, tree=drafter.default_tree))
        else:
            entries.append(DrafterEntry(name=name, kind=str(getattr(value, "kind", type(value).__name__)),
                                        path=None, spec=None, drafter=value, tree=getattr(value, "default_tree", None)))
    if not entries:
        raise DraftsmithError("no drafter to evaluate; pass at least one --drafter (e.g. --drafter ngram)")
    return entries
