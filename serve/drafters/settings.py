"""K and the tree shape of a run: a flag overrides what the drafter records, and drafters that record nothing
draft chains of DEFAULT_K.

A trained drafter folder records them in its config.json: `num_speculative_tokens` (the K it was trained for),
`tree` (null, or the shape it drafts trees with) and `min_confidence` (where its chains stop; applied when the
drafter is built, serve/drafters/folder.py). Generate, eval and the server resolve them here, and report
the K they used.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, Iterable, Mapping

from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.tree import TreeSpec

DEFAULT_K = 5  # draft tokens per cycle for drafters that record no K (ngram, model, oracle)


@dataclass(frozen=True)
class DraftSettings:
    k: int
    tree: TreeSpec | None  # None: chains of up to k tokens

    def describe(self) -> dict[str, Any]:
        return {"k": self.k, "tree": describe_tree(self.tree)}


def describe_tree(tree: TreeSpec | None) -> dict[str, Any] | None:
    if tree is None:
        return None
    if tree.is_static:
        return {"static_choices": [list(c) for c in tree.static_choices]}
    return {key: getattr(tree, key) for key in ("depth", "top_k", "total_tokens")}


def tree_from_record(record: Mapping[str, Any] | None) -> TreeSpec | None:
    """A folder's recorded `tree` (null, {depth, top_k, total_tokens} or {static_choices}) -> TreeSpec."""
    if not record:
        return None
    fields = dict(record)
    if "static_choices" in fields:
        fields["static_choices"] = tuple(tuple(int(r) for r in c) for c in fields["static_choices"])
    try:
        tree = TreeSpec(**fields)
    except TypeError:
        raise DraftsmithError(f"drafter config tree {dict(record)} has unknown keys; valid: "
                              f"{', '.join(asdict(TreeSpec()))}") from None
    if not tree.is_static and min(tree.depth, tree.top_k, tree.total_tokens) < 1:
        raise DraftsmithError(f"drafter config tree {dict(record)}: depth, top_k and total_tokens must be >= 1")
    return tree


def recorded_k(drafter: Any) -> int | None:
    return getattr(drafter, "default_k", None)


def resolve_k(drafters: Iterable[Any], k: int | None = None) -> int:
    """`k` when given; else the K the drafters record (they must agree), else DEFAULT_K."""
    if k is not None:
        if k < 1:
            raise DraftsmithError(f"k must be >= 1, got {k}")
        return int(k)
    recorded = [(getattr(d, "kind", "?"), recorded_k(d)) for d in drafters if recorded_k(d) is not None]
    if len({kk for _, kk in recorded}) > 1:
        found = ", ".join(f"{kind} K={kk}" for kind, kk in recorded)
        raise DraftsmithError(f"the drafters were trained for different K ({found}); pass --k (or k=N) to run "
                              f"them at one K")
    return recorded[0][1] if recorded else DEFAULT_K


def choose_tree(recorded: TreeSpec | None, *, tree: bool | None, shape: Mapping[str, int] | None = None
                ) -> TreeSpec | None:
    """The one rule of every way to ask for trees (the spec's `@tree[:keys]` / `@chain`, `generate --tree /
    --no-tree`, the server's `tree.enabled` and `tree.depth/top_k/total_tokens`). True: trees (the recorded shape,
    or EAGLE-2's default, with `shape`'s keys replaced); False: chains; None: as recorded (its shape with
    `shape`'s keys replaced when it records a tree). None = chains."""
    if tree is False or (tree is None and recorded is None):
        return None
    return replace(recorded or TreeSpec(), **dict(shape or {}))


def resolve_tree(drafter: Any, tree: bool | None = None, shape: Mapping[str, int] | None = None) -> TreeSpec | None:
    """A command's choice (flag or config) over the tree `drafter` drafts by default (its folder's record, as the
    spec's @tree / @chain left it when the drafter was built)."""
    return choose_tree(getattr(drafter, "default_tree", None), tree=tree, shape=shape)


def draft_settings(drafter: Any, *, k: int | None = None, tree: bool | None = None,
                   shape: Mapping[str, int] | None = None) -> DraftSettings:
    """The K and tree a run of `drafter` uses (None: the drafter, or no drafter at all, has its say)."""
    drafters = [drafter] if drafter is not None else []
    return DraftSettings(k=resolve_k(drafters, k), tree=resolve_tree(drafter, tree, shape) if drafters else None)
