"""Drafters to evaluate: `name=spec` parsing, building them through `serve.drafters.build_drafter`,
and what the report says about each (name, kind, path, tree).

A spec ending in `@tree` drafts trees (EAGLE-2 dynamic trees by default; `@tree:depth=5,top_k=4,total_tokens=24`
sets them); EAGLE and Medusa heads support trees, so `--drafter e3=DIR --drafter e3-tree=DIR@tree` compares both."""
from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from serve.errors import DraftsmithError

BASELINE = "plain"  # the name of plain decoding in results and records
RESERVED_NAMES = (BASELINE,)
_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")


@dataclass
class DrafterEntry:
    name: str
    kind: str
    path: str | None  # the drafter's folder or model path, None for ngram / oracle
    spec: str | None  # what the user passed, None when given a built drafter
    drafter: Any  # a serve.drafters.base.Drafter
    tree: Any = None  # a serve.tree.TreeSpec: this entry drafts trees

    def describe(self) -> dict[str, Any]:
        tree = None if self.tree is None else {k: getattr(self.tree, k) for k in ("depth", "top_k", "total_tokens")}
        return {"name": self.name, "kind": self.kind, "path": self.path, "spec": self.spec, "tree": tree}


TREE_SUFFIX = "@tree"
TREE_KINDS = ("eagle1", "eagle3", "medusa")


def split_tree(spec: str) -> tuple[str, Any]:
    """`DIR@tree[:depth=5,top_k=4,total_tokens=24]` -> (DIR, TreeSpec); a spec without the suffix -> (spec, None)."""
    from serve.tree import TreeSpec

    base, sep, rest = spec.partition(TREE_SUFFIX)
    if not sep:
        return spec, None
    if rest and not rest.startswith(":"):
        raise DraftsmithError(f"bad tree suffix in {spec!r}: use {TREE_SUFFIX} or {TREE_SUFFIX}:depth=5,top_k=4,total_tokens=24")
    opts = {}
    for item in filter(None, rest[1:].split(",")):
        key, eq, value = item.partition("=")
        if not eq or key not in ("depth", "top_k", "total_tokens") or not value.isdigit() or int(value) < 1:
            raise DraftsmithError(f"bad tree option {item!r} in {spec!r}: depth, top_k and total_tokens take "
                                  f"positive integers")
        opts[key] = int(value)
    return base, TreeSpec(**opts)


def default_name(spec: str) -> str:
    """A readable label: `ngram`, `ngram:n=3`, `oracle`, `model:<folder name>`, or the folder's name."""
    if spec.startswith("model:"):
        return "model:" + Path(spec.split(":", 1)[1]).name
    base, tree = split_tree(spec)
    if Path(base).exists():
        return Path(base).resolve().name + ("-tree" if tree is not None else "")
    return spec


def parse_named_specs(texts: Sequence[str]) -> dict[str, str]:
    """`["ngram", "mine=path/to/folder"]` -> {"ngram": "ngram", "mine": "path/to/folder"}.

    A `name=` prefix is only read as a label when the whole text is not an existing path and the
    part after `=` is not an option of the spec (as in `ngram:n=3`).
    """
    out: dict[str, str] = {}
    for text in texts:
        name, spec = None, text
        if "=" in text and not Path(text).exists():
            head, rest = text.split("=", 1)
            if _NAME.match(head) and ":" not in head and rest:
                name, spec = head, rest
        name = name or default_name(spec)
        if name in out:
            raise DraftsmithError(f"two drafters are named {name!r}; label them, e.g. --drafter a={spec}")
        out[name] = spec
    return out


def spec_path(spec: str) -> str | None:
    spec = split_tree(spec)[0]
    if spec.startswith("model:"):
        return spec.split(":", 1)[1]
    for candidate in (spec, spec.rpartition(":")[0]):  # `DIR` or `DIR:min_confidence=0.3`
        if candidate and Path(candidate).exists():
            return str(Path(candidate).resolve())
    return None


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


def build_entries(target: Any, drafters: Mapping[str, Any], *, max_new_tokens: int) -> list[DrafterEntry]:
    """Build every drafter against `target`; a value is a spec string or an already built Drafter.

    max_new_tokens: the longest generation of the run (the oracle precomputes that many tokens).
    """
    from serve.drafters import build_drafter

    entries = []
    for name, value in drafters.items():
        if name in RESERVED_NAMES or not name.strip():
            raise DraftsmithError(f"drafter name {name!r} is reserved for the baseline or empty; pick another")
        if isinstance(value, str):
            base, tree = split_tree(value)
            opts = {"max_new_tokens": max_new_tokens} if base == "oracle" else {}
            drafter = build_drafter(base, target, **opts)
            if tree is not None and drafter.kind not in TREE_KINDS:
                raise DraftsmithError(f"drafter {name!r} ({drafter.kind}) drafts chains only; trees need an EAGLE or "
                                      f"Medusa drafter folder")
            entries.append(DrafterEntry(name=name, kind=str(drafter.kind), path=spec_path(value), spec=value,
                                        drafter=drafter, tree=tree))
        else:
            entries.append(DrafterEntry(name=name, kind=str(getattr(value, "kind", type(value).__name__)),
                                        path=None, spec=None, drafter=value))
    if not entries:
        raise DraftsmithError("no drafter to evaluate; pass at least one --drafter (e.g. --drafter ngram)")
    return entries
