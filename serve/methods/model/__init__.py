"""A draft model: a small causal LM of the target's tokenizer drafts autoregressively, trained on nothing here. Its
drafter (drafter.py) and how its spec `model:PATH[:length=fixed]` reads and builds (below)."""
from __future__ import annotations

from pathlib import Path

from draftsmith.serve.drafters.spec import DrafterSpec, DrafterSpecError, path_options, split_tree
from draftsmith.serve.drafters.target_policy import length_policy
from draftsmith.serve.methods.model.drafter import ModelDrafter
from draftsmith.serve.methods.registry import Method, register
from draftsmith.serve.core.target import Target


def _parse(rest: str, common: dict) -> DrafterSpec:
    if not rest:
        raise DrafterSpecError("the model drafter needs a path: model:PATH_TO_SMALL_LM")
    path, opts = path_options(rest, common["text"], exists=Path.exists)
    return DrafterSpec(kind="model", path=path or rest, options=opts, **common)


def _build(parsed: DrafterSpec, target: Target, opts: dict) -> ModelDrafter:
    from draftsmith.serve.core.target import load_target, text_config

    given = {**parsed.options, **opts}
    if set(given) - {"length"}:
        raise DrafterSpecError(f"unknown model drafter option(s) {sorted(set(given) - {'length'})}; valid: length")
    # the draft model's tokens are only proposals, verified by the target: its ordinary kernels
    small = load_target(parsed.path, dtype=target.model.dtype, device=str(target.model.device), invariant="off")
    return ModelDrafter(small.model, small.tokenizer, target_vocab_size=text_config(target.config).vocab_size,
                        policy=length_policy(target, str(given.get("length", "auto"))))


METHOD = register(Method(name="model", title="draft model", usage="model:PATH", parse=_parse, build=_build,
                         label=lambda rest: "model:" + Path(split_tree(rest)[0]).name, assistant=True))
