"""Prompt lookup (n-gram): drafts what followed the longest earlier match of the context's suffix, trained on
nothing. Its drafter (drafter.py) and how its spec `ngram[:max_n=16,min_n=1,max_k=16,length=auto]` reads and builds
(below)."""
from __future__ import annotations

from draftsmith.serve.drafters.spec import DrafterSpec, DrafterSpecError, options
from draftsmith.serve.drafters.target_policy import length_policy
from draftsmith.serve.methods.ngram.drafter import GENERATION_WEIGHT, LOCAL_WEIGHT, NgramDrafter
from draftsmith.serve.methods.registry import Method, register
from draftsmith.serve.core.target import Target

SIZES = ("max_n", "min_n", "max_k")


def ngram_policy(target: Target, length: str):
    """An n-gram drafter's length policy, alone or a hybrid's side (the same, so that a hybrid's n-gram arm is the
    n-gram drafter): per step, it also learns from the current generation (LOCAL_WEIGHT), and its estimates follow
    how the generation's drafts fared (GENERATION_WEIGHT)."""
    return length_policy(target, length, local_weight=LOCAL_WEIGHT, generation_weight=GENERATION_WEIGHT)


def _build(parsed: DrafterSpec, target: Target, opts: dict) -> NgramDrafter:
    given = {**parsed.options, **opts}
    unknown = set(given) - {*SIZES, "length"}
    if unknown:
        raise DrafterSpecError(f"unknown ngram option(s) {sorted(unknown)}; valid: {', '.join(SIZES)}, length")
    policy = ngram_policy(target, str(given.pop("length", "auto")))
    try:
        sizes = {k: int(v) for k, v in given.items()}
    except ValueError:
        raise DrafterSpecError(f"ngram options take integers: {parsed.text!r}") from None
    try:
        return NgramDrafter(**sizes, policy=policy)
    except ValueError as err:
        raise DrafterSpecError(f"bad ngram option in {parsed.text!r}: {err}") from None


METHOD = register(Method(name="ngram", title="n-gram", usage="ngram, ngram:max_n=3",
                         parse=lambda rest, common: DrafterSpec(kind="ngram", options=options(rest), **common),
                         build=_build, lookup=True))
