"""EAGLE-3 (Li et al. 2025): fuses a low, a middle and a high target layer, drafts over its own reduced vocabulary,
trained by training-time test. Its head (head.py), objective (objective.py), and what the project asks of it
(below)."""
from __future__ import annotations

from draftsmith.serve.core.layers import check_eagle3_layers, default_eagle3_layers
from draftsmith.serve.drafters.eagle_drafter import EagleDrafter
from draftsmith.serve.methods.eagle3 import to_sglang, to_speculators, to_vllm
from draftsmith.serve.methods.eagle3.head import Eagle3Head, eagle3_config
from draftsmith.serve.methods.eagle3.objective import eagle3_objective
from draftsmith.serve.methods.registry import Method, register
from draftsmith.serve.core.target import Target


def _config(model, target: Target):
    cfg = eagle3_config(target, draft_vocab_size=model.draft_vocab_size or None,
                        aux_layer_ids=model.aux_layer_ids or None, num_speculative_tokens=model.num_speculative_tokens,
                        ttt_steps=model.ttt_steps, fc_norm=model.fc_norm, norm_before_fc=model.norm_before_fc,
                        norm_output=model.norm_output, attn_implementation=model.attn_implementation)
    check_eagle3_layers(cfg.aux_layer_ids, target.num_layers)  # refused now rather than at export
    return cfg


def _check(config) -> None:
    if config.model.aux_layer_ids:
        check_eagle3_layers(config.model.aux_layer_ids)  # what export would refuse; the depth is checked at load


METHOD = register(Method(
    name="eagle3", title="EAGLE-3", config=_config, head=Eagle3Head, drafter=EagleDrafter, objective=eagle3_objective,
    layers=lambda num_layers: tuple(default_eagle3_layers(num_layers)),  # low, middle, high
    unroll=lambda model, cfg, length: model.ttt_steps,  # training-time test runs the head ttt_steps times per position
    check=_check, llama_layer=True, own_vocab=True, options=("fc_norm", "norm_before_fc", "norm_output"),
    position_weightings=("decay", "dpace"),
    exports={"vllm": to_vllm.FORM, "sglang": to_sglang.FORM, "speculators": to_speculators.FORM}, trees=True))
