"""Medusa-1 (Cai et al. 2024): independent heads on the target's last final feature, head i predicting the token
i+1 places after the pending one. Its heads and drafter (head.py), objective (objective.py), and what the project
asks of it (below)."""
from __future__ import annotations

from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.core.layers import FINAL
from draftsmith.serve.methods.medusa.export import EXPORTS
from draftsmith.serve.methods.medusa.head import MedusaDrafter, MedusaHeads, medusa_config
from draftsmith.serve.methods.medusa.objective import medusa_objective
from draftsmith.serve.methods.registry import Method, register
from draftsmith.serve.core.target import Target


def _config(model, target: Target):
    return medusa_config(target, num_heads=model.num_speculative_tokens, num_layers=model.medusa_num_layers,
                         draft_vocab_size=model.draft_vocab_size or None)


def _check(config) -> None:
    if config.loss.prompt_weight:
        raise DraftsmithError("loss.prompt_weight needs soft targets (EAGLE-1/3): Medusa learns the data's tokens, "
                              "and prompt tokens are the user's, not the target's")
    if config.loss.kind != "ce":
        raise DraftsmithError(f"loss.kind={config.loss.kind} needs soft targets (EAGLE-1/3): Medusa learns the data's "
                              f"tokens with a cross-entropy, and an acceptance loss needs the target's distribution; "
                              f"leave loss.kind=ce")


METHOD = register(Method(
    name="medusa", title="Medusa", config=_config, head=MedusaHeads, drafter=MedusaDrafter, objective=medusa_objective,
    layers=lambda num_layers: (FINAL,),
    unroll=lambda model, cfg, length: cfg.num_speculative_tokens,  # every head on every position
    check=_check, own_vocab=True, options=("medusa_num_layers",), exports=EXPORTS,
    validation_k=lambda cfg: cfg.num_speculative_tokens,  # all heads run in one forward: compare them all
    trees=True))
