"""The oracle: drafts the target's own answer (a plain greedy run at begin()), so every draft is accepted; the
ceiling of a decoder at this K, never a drafter to deploy. Its drafter (drafter.py) and its spec `oracle` (below)."""
from __future__ import annotations

from draftsmith.serve.drafters.spec import DrafterSpec
from draftsmith.serve.methods.oracle.drafter import OracleDrafter
from draftsmith.serve.methods.registry import Method, register
from draftsmith.serve.core.target import Target


def _build(parsed: DrafterSpec, target: Target, opts: dict) -> OracleDrafter:
    from draftsmith.serve.decoding import plain_generate  # the oracle's answer key: what plain decoding outputs

    return OracleDrafter(target, generate=plain_generate, **opts)


METHOD = register(Method(name="oracle", title="oracle", usage="oracle",
                         parse=lambda rest, common: None if rest else DrafterSpec(kind="oracle", **common),
                         build=_build, ceiling=True))
