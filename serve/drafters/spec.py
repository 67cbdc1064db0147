"""Drafter spec strings, parsed here and nowhere else:

    [NAME=]DRAFTER[@tree[:depth=5,top_k=4,total_tokens=24] | @chain]

    DRAFTER   ngram | ngram:max_n=4,min_n=2    prompt lookup (max_k=16: while it copies a passage, a cycle may
                                               draft up to 16 tokens, past K; max_k=0: K)
              oracle                           the target's own answer (the ceiling for a decoder at this K)
              model:PATH                       a small causal LM with the target's tokenizer
              DIR | DIR:min_confidence=0.3     a trained drafter folder (options override what it records;
                                               DIR:leaves=0 drafts EAGLE chains without runner-up leaves)
              hybrid:DIR | hybrid:model:PATH   the n-gram continuation, that drafter's draft (its options as
                                               above) or a tree of both, the best so far on the request
    :length=  auto (default): the draft length is chosen per step; fixed: K every cycle (ngram, model, DIR,
              hybrid:DIR:length=fixed; serve/drafters/length.py)
    @tree     draft trees (EAGLE and Medusa folders): the folder's recorded shape, or EAGLE-2's default,
              with the given keys replaced; @chain drafts chains even where the folder records a tree
    NAME=     a label for the drafter in an evaluation (`mine=runs/eagle3`)
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from draftsmith.serve.drafters.settings import choose_tree
from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.methods.registry import find, has, names
from draftsmith.serve.tree import TreeSpec

TREE_SUFFIX = "@tree"
CHAIN_SUFFIX = "@chain"
TREE_OPTIONS = ("depth", "top_k", "total_tokens")
FOLDER = "folder"  # the kind of a trained drafter folder's spec: its method is what its config.json records
_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")


class DrafterSpecError(DraftsmithError):
    pass


@dataclass(frozen=True)
class DrafterSpec:
    text: str  # as the user wrote it, without a NAME= label
    kind: str  # FOLDER, or the registered untrained method that parsed it (serve/methods/registry.py)
    path: str | None = None  # the folder (folder) or the small LM (model)
    options: dict[str, str] = field(default_factory=dict)  # `:key=value,...` after ngram, model:PATH or a folder
    head: DrafterSpec | None = None  # hybrid: the trained drafter beside the n-gram one
    tree: bool | None = None  # True: @tree, False: @chain, None: whatever the drafter records
    tree_shape: dict[str, int] = field(default_factory=dict)  # the keys @tree: sets

    @property
    def drafts_from_a_model(self) -> bool:
        """A trained drafter folder, a draft model, or a head the target ships (MTP): what a hybrid pairs with its
        n-gram side."""
        return self.kind == FOLDER or has(self.kind, "assistant") or has(self.kind, "trained")

    @property
    def named(self) -> "DrafterSpec":
        """The spec of the drafter that names a path: the head of a spec that wraps one (hybrid:DIR), else itself."""
        return self.head if self.head is not None else self

    def tree_for(self, recorded: TreeSpec | None) -> TreeSpec | None:
        """The tree this spec drafts, given the one the drafter records (None = chains)."""
        return choose_tree(recorded, tree=self.tree, shape=self.tree_shape)


def options(text: str) -> dict[str, str]:
    """`a=1,b=2` -> {"a": "1", "b": "2"}."""
    opts = {}
    for item in filter(None, text.split(",")):
        if "=" not in item:
            raise DrafterSpecError(f"drafter option {item!r} is not key=value")
        key, value = item.split("=", 1)
        opts[key.strip()] = value.strip()
    return opts


def split_tree(spec: str) -> tuple[str, TreeSpec | None]:
    """`DIR@tree[:depth=5,...]` -> (DIR, TreeSpec of those keys); a spec without the suffix -> (spec, None)."""
    base, tree, shape = _split_tree(spec)
    return base, choose_tree(None, tree=tree, shape=shape)


def _split_tree(spec: str) -> tuple[str, bool | None, dict[str, int]]:
    if spec.endswith(CHAIN_SUFFIX):
        return spec[: -len(CHAIN_SUFFIX)], False, {}
    base, sep, rest = spec.partition(TREE_SUFFIX)
    if not sep:
        return spec, None, {}
    if rest and not rest.startswith(":"):
        raise DrafterSpecError(f"bad tree suffix in {spec!r}: use {TREE_SUFFIX} or "
                               f"{TREE_SUFFIX}:depth=5,top_k=4,total_tokens=24")
    shape = {}
    for item in filter(None, rest[1:].split(",")):
        key, eq, value = item.partition("=")
        if not eq or key not in TREE_OPTIONS or not value.isdigit() or int(value) < 1:
            raise DrafterSpecError(f"bad tree option {item!r} in {spec!r}: depth, top_k and total_tokens take "
                                   f"positive integers")
        shape[key] = int(value)
    return base, True, shape


def parse_drafter_spec(text: str) -> DrafterSpec:
    """A spec string (no NAME= label) -> DrafterSpec; whether a folder really is a drafter folder is checked
    when it is built."""
    base, tree, shape = _split_tree(text)
    kind, _, rest = base.partition(":")
    common = dict(text=text, tree=tree, tree_shape=shape)
    untrained = find(kind)
    if untrained is not None and untrained.parse is not None:
        parsed = untrained.parse(rest, common)
        if parsed is not None:
            return parsed
    if Path(base).is_dir():
        return DrafterSpec(kind=FOLDER, path=base, **common)
    folder, opts = path_options(base, text, exists=Path.is_dir)
    if folder:
        return DrafterSpec(kind=FOLDER, path=folder, options=opts, **common)
    if "/" in base or base.startswith((".", "~")):
        raise DrafterSpecError(f"no such drafter folder: {base} (from the drafter spec {text!r}); check the path, or "
                               f"train one with `draftsmith train`")
    usages = [find(name).usage for name in names() if find(name).usage]
    raise DrafterSpecError(f"unknown drafter {text!r}: use {', '.join(usages)}, or a trained drafter folder")


def path_options(base: str, text: str, *, exists) -> tuple[str | None, dict[str, str]]:
    """`PATH:key=value,...` -> (PATH, options) when PATH exists and the whole does not; else (None, {})."""
    path, _, rest = base.rpartition(":")
    if not path or Path(base).exists() or not exists(Path(path)) or "=" not in rest:
        return None, {}
    try:
        return path, options(rest)
    except DrafterSpecError as err:
        raise DrafterSpecError(f"bad drafter option in {text!r}: {err}") from None


def default_name(spec: str) -> str:
    """A readable label: `ngram`, `ngram:n=3`, `oracle`, `model:<folder name>`, the folder's name, or
    `hybrid:<that>` (a method's own `label` of the text after `name:`)."""
    kind, sep, rest = spec.partition(":")
    untrained = find(kind) if sep else None
    if untrained is not None and untrained.label is not None:
        return untrained.label(rest)
    base, tree, _ = _split_tree(spec)
    if Path(base).exists():
        return Path(base).resolve().name + ("-tree" if tree else "")
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
    """The folder or model path a spec names (resolved), None for ngram and oracle."""
    try:
        parsed = parse_drafter_spec(spec).named
    except DrafterSpecError:
        return None
    return str(Path(parsed.path).resolve()) if parsed.kind == FOLDER else parsed.path
