"""Drafters by spec (serve/drafters/spec.py): `ngram[:max_n=16,min_n=1,max_k=16]`, `model:PATH`, `oracle`, a native
drafter folder (`DIR`, `DIR:min_confidence=0.3`), or `hybrid:DIR` (the n-gram continuation where the context
holds a good match, the folder's head elsewhere), optionally `@tree[:depth=5,...]` or `@chain`.

Every drafter but the oracle chooses its draft length per cycle (`length=auto`, serve/drafters/length.py);
`length=fixed` drafts K every cycle: `ngram:length=fixed`, `DIR:length=fixed`, `hybrid:DIR:length=fixed`."""
from __future__ import annotations

from draftsmith.serve.drafters.base import Draft, Drafter
from draftsmith.serve.drafters.spec import FOLDER, DrafterSpec, DrafterSpecError, parse_drafter_spec
from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.core.layers import FINAL
from draftsmith.serve.methods.registry import has, method, names
from draftsmith.serve.core.target import Target

__all__ = ["FINAL", "Draft", "Drafter", "DrafterSpec", "DrafterSpecError", "build_drafter", "parse_drafter_spec"]


def build_drafter(spec: str | DrafterSpec, target: Target, **opts) -> Drafter:
    """Build a drafter for `target` from a spec; checks it can serve that target. `opts` are keyword arguments
    of the drafter class (e.g. the oracle's max_new_tokens), winning over the spec's options. A trained drafter
    folder loads as its config.json's method says; any other spec is built by the method that parsed it."""
    parsed = spec if isinstance(spec, DrafterSpec) else parse_drafter_spec(spec)
    if parsed.kind == FOLDER:
        drafter = _folder_drafter(parsed, target, opts)
    else:
        drafter = method(parsed.kind).build(parsed, target, opts)
    drafter.default_tree = parsed.tree_for(drafter.default_tree)
    if parsed.tree and not has(drafter.kind, "trees"):
        raise DrafterSpecError(f"drafter {parsed.text!r} ({drafter.kind}) drafts chains only; trees need a drafter "
                               f"of {', '.join(n for n in names() if has(n, 'trees'))}")
    drafter.check_target(target)
    return drafter


def _folder_drafter(parsed: DrafterSpec, target: Target, opts: dict) -> Drafter:
    from draftsmith.serve.drafters.folder import load_drafter, read_config

    try:
        read_config(parsed.path)  # not a drafter folder, or a damaged config.json: says which
    except DraftsmithError as err:
        raise DrafterSpecError(str(err)) from None
    if not parsed.options:
        return load_drafter(parsed.path, target, **opts)
    try:
        return load_drafter(parsed.path, target, **{**parsed.options, **opts})
    except ValueError as err:  # a value that does not parse, or one the drafter refuses
        raise DrafterSpecError(f"bad drafter option in {parsed.text!r}: {err}") from None
