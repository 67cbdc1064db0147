"""Drafters by spec (serve/drafters/spec.py): `ngram[:max_n=4,min_n=2]`, `model:PATH`, `oracle`, or a native
drafter folder (`DIR`, `DIR:min_confidence=0.3`), optionally `@tree[:depth=5,...]` or `@chain`."""
from __future__ import annotations

from serve.drafters.base import Draft, Drafter
from serve.drafters.spec import TREE_KINDS, DrafterSpec, DrafterSpecError, parse_drafter_spec
from serve.layers import FINAL

__all__ = ["FINAL", "Draft", "Drafter", "DrafterSpec", "DrafterSpecError", "build_drafter", "parse_drafter_spec"]


def build_drafter(spec: str | DrafterSpec, target, **opts) -> Drafter:
    """Build a drafter for `target` from a spec; checks it can serve that target. `opts` are keyword arguments
    of the drafter class (e.g. the oracle's max_new_tokens), winning over the spec's options."""
    parsed = spec if isinstance(spec, DrafterSpec) else parse_drafter_spec(spec)
    if parsed.kind == "ngram":
        from serve.drafters.ngram import NgramDrafter

        unknown = set(parsed.options) - {"max_n", "min_n"}
        if unknown:
            raise DrafterSpecError(f"unknown ngram option(s) {sorted(unknown)}; valid: max_n, min_n")
        try:
            sizes = {k: int(v) for k, v in parsed.options.items()}
        except ValueError:
            raise DrafterSpecError(f"ngram options take integers: {parsed.text!r}") from None
        drafter = NgramDrafter(**{**sizes, **opts})
    elif parsed.kind == "oracle":
        from serve.drafters.oracle import OracleDrafter

        drafter = OracleDrafter(target, **opts)
    elif parsed.kind == "model":
        from serve.drafters.model import ModelDrafter
        from serve.target import load_target, text_config

        small = load_target(parsed.path, dtype=target.model.dtype, device=str(target.model.device))
        drafter = ModelDrafter(small.model, small.tokenizer, target_vocab_size=text_config(target.config).vocab_size)
    else:
        drafter = _folder_drafter(parsed, target, opts)
    drafter.default_tree = parsed.tree_for(drafter.default_tree)
    if parsed.tree and drafter.kind not in TREE_KINDS:
        raise DrafterSpecError(f"drafter {parsed.text!r} ({drafter.kind}) drafts chains only; trees need an EAGLE or "
                               f"Medusa drafter folder")
    drafter.check_target(target)
    return drafter


def _folder_drafter(parsed: DrafterSpec, target, opts: dict) -> Drafter:
    from serve.drafters.folder import is_drafter_folder, load_drafter

    if not is_drafter_folder(parsed.path):
        raise DrafterSpecError(f"{parsed.path} is not a draftsmith drafter folder (its config.json has no "
                               f"'draftsmith_drafter' entry); train one with `draftsmith train`")
    if not parsed.options:
        return load_drafter(parsed.path, target, **opts)
    try:
        return load_drafter(parsed.path, target, **{**parsed.options, **opts})
    except ValueError as err:  # a value that does not parse, or one the drafter refuses
        raise DrafterSpecError(f"bad drafter option in {parsed.text!r}: {err}") from None
