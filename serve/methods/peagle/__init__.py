"""P-EAGLE (arXiv 2602.01469): an EAGLE-3 head that drafts all K tokens in one forward, its later positions fed a
mask token and a learned hidden vector; trained on every depth at once, without the unrolled training-time test.
Its head (head.py), objective (objective.py), drafter (drafter.py), engine form (to_vllm.py), and what the project
asks of it (below). It reads EAGLE-3's aux layers, so one capture trains both."""
from __future__ import annotations

from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.core.layers import check_eagle3_layers, default_eagle3_layers
from draftsmith.serve.core.target import Target
from draftsmith.serve.methods.dflash.head import recipe_mask_token
from draftsmith.serve.methods.peagle.drafter import PEagleDrafter
from draftsmith.serve.methods.peagle.head import PEagleHead, peagle_config
from draftsmith.serve.methods.peagle import to_vllm
from draftsmith.serve.methods.peagle.objective import peagle_objective
from draftsmith.serve.methods.registry import Method, register

DEPTHS_MAX = 16  # the most tokens one forward may draft (the paper and vLLM use up to 8)


def _config(model, target: Target):
    mask = recipe_mask_token(target, model.mask_token_id, method="peagle", slots="the mask slots")
    cfg = peagle_config(target, depths=model.num_speculative_tokens, mask_token_id=mask,
                        draft_vocab_size=model.draft_vocab_size or None, aux_layer_ids=model.aux_layer_ids or None,
                        fc_norm=model.fc_norm, norm_before_fc=model.norm_before_fc,
                        attn_implementation=model.attn_implementation)
    check_eagle3_layers(cfg.aux_layer_ids, target.num_layers)
    return cfg


def _check(config) -> None:
    k = config.model.num_speculative_tokens
    if not 2 <= k <= DEPTHS_MAX:
        raise DraftsmithError(f"model.num_speculative_tokens={k}: P-EAGLE drafts 2..{DEPTHS_MAX} tokens in one "
                              f"forward (its depth 0 and at least one mask slot); 4-8 are usual")
    if config.model.aux_layer_ids:
        check_eagle3_layers(config.model.aux_layer_ids)


METHOD = register(Method(
    name="peagle", title="P-EAGLE", config=_config, head=PEagleHead, drafter=PEagleDrafter,
    objective=peagle_objective, layers=lambda num_layers: tuple(default_eagle3_layers(num_layers)),
    # every real position, and K-1 slots for each of `anchors` positions a row
    unroll=lambda model, cfg, length: 1 + (cfg.num_speculative_tokens - 1) * min(length, model.anchors) /
    max(length, 1),
    check=_check, llama_layer=True, own_vocab=True, variant_of="eagle3",
    options=("fc_norm", "norm_before_fc", "mask_token_id", "anchors"),
    exports={"vllm": to_vllm.FORM}, validation_k=lambda cfg: cfg.num_speculative_tokens, trees=True,
    unexported="SGLang serves no P-EAGLE, and draftsmith does not write speculators' `peagle` folders yet: export "
               "--format vllm (vLLM 0.16-0.33), or train model.method=eagle3"))
