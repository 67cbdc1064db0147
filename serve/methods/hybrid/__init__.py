"""The hybrid: an n-gram drafter beside a trained head (or a draft model), the n-gram continuation where the context
holds a good match, the head's draft or a tree of both elsewhere, the best so far on the request. Its drafter
(drafter.py, arms.py) and how its spec `hybrid:DIR[:options]` reads and builds (below)."""
from __future__ import annotations

from draftsmith.serve.drafters.spec import DrafterSpec, DrafterSpecError, default_name, parse_drafter_spec
from draftsmith.serve.methods.hybrid.drafter import HybridDrafter, hybrid_of
from draftsmith.serve.methods.ngram import ngram_policy
from draftsmith.serve.methods.registry import Method, register
from draftsmith.serve.core.target import Target


def _parse(rest: str, common: dict) -> DrafterSpec:
    head = parse_drafter_spec(rest) if rest else None
    if head is None or not head.drafts_from_a_model:
        raise DrafterSpecError(f"the hybrid drafter needs a trained drafter: hybrid:DIR (or hybrid:model:PATH, "
                               f"hybrid:mtp), got {common['text']!r}")
    return DrafterSpec(kind="hybrid", path=head.path, head=head, **common)


def _build(parsed: DrafterSpec, target: Target, opts: dict) -> HybridDrafter:
    from draftsmith.serve.drafters import build_drafter

    head = build_drafter(parsed.head, target, **opts)
    # the n-gram side drafts like the head: a fixed K when the head was pinned to one
    length = "fixed" if getattr(head.policy, "name", "") == "fixed" else "auto"
    return hybrid_of(head, ngram_policy(target, length))


METHOD = register(Method(name="hybrid", title="hybrid", usage="hybrid:DIR", parse=_parse, build=_build,
                         label=lambda rest: "hybrid:" + default_name(rest), trees=True))
