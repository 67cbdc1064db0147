"""DFlash (Chen et al. 2026, arXiv 2602.06036; z-lab/dflash): block drafting. A few decoder layers read the target's
fused features as keys and values and draft a whole block of B-1 tokens in one forward; trained on random anchors
with a position-decayed loss. Its head (head.py), objective (objective.py), drafter (drafter.py), and what the
project asks of it (below). Its default aux layers are EAGLE-3's, so one capture trains both."""
from __future__ import annotations

from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.core.layers import default_eagle3_layers
from draftsmith.serve.core.target import Target
from draftsmith.serve.methods.dflash import to_speculators, to_vllm
from draftsmith.serve.methods.dflash.drafter import DFlashDrafter
from draftsmith.serve.methods.dflash.head import DFlashHead, check_block_size, dflash_config, recipe_mask_token
from draftsmith.serve.methods.dflash.objective import dflash_objective
from draftsmith.serve.methods.registry import Method, register


def _config(model, target: Target):
    mask = recipe_mask_token(target, model.mask_token_id, method="dflash", slots="a block's drafted slots")
    return dflash_config(target, aux_layer_ids=model.aux_layer_ids or None, block_size=model.block_size,
                         draft_layers=model.draft_layers, mask_token_id=mask,
                         attn_implementation=model.attn_implementation)


def _check(config) -> None:
    if config.model.draft_vocab_size:
        raise DraftsmithError("DFlash drafts through the target's lm_head: model.draft_vocab_size must be 0")
    k, default_k = config.model.num_speculative_tokens, type(config.model).num_speculative_tokens
    if k not in (default_k, config.model.block_size - 1):
        raise DraftsmithError(f"DFlash drafts model.block_size-1 = {config.model.block_size - 1} tokens a cycle: "
                              f"set model.block_size instead of model.num_speculative_tokens")
    check_block_size(config.model.block_size)


METHOD = register(Method(
    name="dflash", title="DFlash", config=_config, head=DFlashHead, drafter=DFlashDrafter, objective=dflash_objective,
    layers=lambda num_layers: tuple(default_eagle3_layers(num_layers)),
    # every layer runs over a block of queries per anchor, `anchors` of them a row (at most one a position)
    unroll=lambda model, cfg, length: int(cfg.layer_config.get("num_hidden_layers", 1)) *
    min(length, model.anchors) * cfg.block_size / max(length, 1),
    check=_check, options=("block_size", "draft_layers", "mask_token_id", "anchors"),
    position_weightings=("decay", "dpace"),
    validation_k=lambda cfg: cfg.block_size - 1, trees=True,
    exports={"vllm": to_vllm.FORM, "sglang": to_vllm.SGLANG_FORM, "speculators": to_speculators.FORM}))
