"""Drafters by spec (serve/drafters/spec.py): `ngram[:max_n=16,min_n=1,max_k=16]`, `model:PATH`, `oracle`, a native
drafter folder (`DIR`, `DIR:min_confidence=0.3`), or `hybrid:DIR` (the n-gram continuation where the context
holds a good match, the folder's head elsewhere), optionally `@tree[:depth=5,...]` or `@chain`.

Every drafter but the oracle chooses its draft length per cycle (`length=auto`, serve/drafters/length.py);
`length=fixed` drafts K every cycle: `ngram:length=fixed`, `DIR:length=fixed`, `hybrid:DIR:length=fixed`."""
from __future__ import annotations

from draftsmith.serve.drafters.base import Draft, Drafter
from draftsmith.serve.drafters.spec import TREE_KINDS, DrafterSpec, DrafterSpecError, parse_drafter_spec
from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.core.layers import FINAL

__all__ = ["FINAL", "Draft", "Drafter", "DrafterSpec", "DrafterSpecError", "build_drafter", "parse_drafter_spec"]


def build_drafter(spec: str | DrafterSpec, target, **opts) -> Drafter:
    """Build a drafter for `target` from a spec; checks it can serve that target. `opts` are keyword arguments
    of the drafter class (e.g. the oracle's max_new_tokens), winning over the spec's options."""
    parsed = spec if isinstance(spec, DrafterSpec) else parse_drafter_spec(spec)
    if parsed.kind == "ngram":
        from draftsmith.serve.drafters.ngram import NgramDrafter

        options = {**parsed.options, **opts}
        unknown = set(options) - {"max_n", "min_n", "max_k", "length"}
        if unknown:
            raise DrafterSpecError(f"unknown ngram option(s) {sorted(unknown)}; valid: max_n, min_n, max_k, length")
        policy = _ngram_policy(target, str(options.pop("length", "auto")))
        try:
            sizes = {k: int(v) for k, v in options.items()}
        except ValueError:
            raise DrafterSpecError(f"ngram options take integers: {parsed.text!r}") from None
        try:
            drafter = NgramDrafter(**sizes, policy=policy)
        except ValueError as err:
            raise DrafterSpecError(f"bad ngram option in {parsed.text!r}: {err}") from None
    elif parsed.kind == "hybrid":
        from draftsmith.serve.drafters.hybrid import hybrid_of

        head = build_drafter(parsed.head, target, **opts)
        # the n-gram side drafts like the head: a fixed K when the head was pinned to one
        length = "fixed" if getattr(head.policy, "name", "") == "fixed" else "auto"
        drafter = hybrid_of(head, _ngram_policy(target, length))
    elif parsed.kind == "oracle":
        from draftsmith.serve.decoding import plain_generate  # the oracle's answer key: what plain decoding outputs
        from draftsmith.serve.drafters.oracle import OracleDrafter

        drafter = OracleDrafter(target, generate=plain_generate, **opts)
    elif parsed.kind == "model":
        from draftsmith.serve.drafters.model import ModelDrafter
        from draftsmith.serve.core.target import load_target, text_config

        options = {**parsed.options, **opts}
        if set(options) - {"length"}:
            raise DrafterSpecError(f"unknown model drafter option(s) {sorted(set(options) - {'length'})}; "
                                   f"valid: length")
        # the draft model's tokens are only proposals, verified by the target: its ordinary kernels
        small = load_target(parsed.path, dtype=target.model.dtype, device=str(target.model.device), invariant="off")
        drafter = ModelDrafter(small.model, small.tokenizer, target_vocab_size=text_config(target.config).vocab_size,
                               policy=_policy(target, str(options.get("length", "auto"))))
    else:
        drafter = _folder_drafter(parsed, target, opts)
    drafter.default_tree = parsed.tree_for(drafter.default_tree)
    if parsed.tree and drafter.kind not in TREE_KINDS:
        raise DrafterSpecError(f"drafter {parsed.text!r} ({drafter.kind}) drafts chains only; trees need an EAGLE or "
                               f"Medusa drafter folder (or hybrid:DIR)")
    drafter.check_target(target)
    return drafter


def _ngram_policy(target, length: str):
    """An n-gram drafter's length policy, alone or a hybrid's side (the same, so that a hybrid's n-gram arm is the
    n-gram drafter): per step, it also learns from the current generation (serve/drafters/ngram.py, LOCAL_WEIGHT), and
    its estimates follow how the generation's drafts fared (GENERATION_WEIGHT)."""
    from draftsmith.serve.drafters.ngram import GENERATION_WEIGHT, LOCAL_WEIGHT

    return _policy(target, length, local_weight=LOCAL_WEIGHT, generation_weight=GENERATION_WEIGHT)


def _policy(target, length: str, **gain_options):
    from draftsmith.serve.core.costs import verify_costs_for
    from draftsmith.serve.drafters.length import build_policy

    try:
        # measured now (once per model and thread count), so the first generation's timing does not include it
        return build_policy(length, costs=verify_costs_for(target.model) if length == "auto" else None,
                            **(gain_options if length == "auto" else {}))
    except DraftsmithError as err:
        raise DrafterSpecError(str(err)) from None


def _folder_drafter(parsed: DrafterSpec, target, opts: dict) -> Drafter:
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
