"""EAGLE-1 (Li et al. 2024): one Llama decoder layer that regresses the target's next final feature and reads the
target's own lm_head. Its head (head.py), objective (objective.py), and what the project asks of it (below)."""
from __future__ import annotations

from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.core.layers import FINAL
from draftsmith.serve.drafters.eagle_drafter import EagleDrafter
from draftsmith.serve.methods.eagle1.export import EXPORTS
from draftsmith.serve.methods.eagle1.head import Eagle1Head, eagle1_config
from draftsmith.serve.methods.eagle1.objective import eagle1_objective
from draftsmith.serve.methods.registry import Method, register
from draftsmith.serve.core.target import Target


def _config(model, target: Target):
    return eagle1_config(target, fc_bias=model.fc_bias, num_speculative_tokens=model.num_speculative_tokens,
                         attn_implementation=model.attn_implementation)


def _check(config) -> None:
    if config.model.draft_vocab_size:
        raise DraftsmithError("EAGLE-1 reads the target's lm_head: model.draft_vocab_size must be 0")


METHOD = register(Method(
    name="eagle1", title="EAGLE-1", config=_config, head=Eagle1Head, drafter=EagleDrafter, objective=eagle1_objective,
    layers=lambda num_layers: (FINAL,), check=_check, llama_layer=True, options=("fc_bias",), exports=EXPORTS,
    trees=True))
