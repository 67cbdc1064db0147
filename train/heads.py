"""Which head a recipe trains on a target: its HeadConfig (fresh, or continued from model.init_from) and the target
layers its training step reads."""
from __future__ import annotations

from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.core.layers import FINAL, check_eagle3_layers
from draftsmith.serve.drafters.folder import read_config
from draftsmith.serve.drafters.head_config import HeadConfig
from draftsmith.serve.drafters.identity import check_target_identity
from draftsmith.train.config import TrainConfig


def head_config(config: TrainConfig, target) -> HeadConfig:
    m = config.model
    if m.method == "eagle1":
        from draftsmith.serve.drafters.eagle1 import eagle1_config
        return eagle1_config(target, fc_bias=m.fc_bias, num_speculative_tokens=m.num_speculative_tokens,
                             attn_implementation=m.attn_implementation)
    if m.method == "eagle3":
        from draftsmith.serve.drafters.eagle3 import eagle3_config
        cfg = eagle3_config(target, draft_vocab_size=m.draft_vocab_size or None, aux_layer_ids=m.aux_layer_ids or None,
                            num_speculative_tokens=m.num_speculative_tokens, ttt_steps=m.ttt_steps,
                            fc_norm=m.fc_norm, norm_before_fc=m.norm_before_fc,
                            attn_implementation=m.attn_implementation)
        check_eagle3_layers(cfg.aux_layer_ids, target.num_layers)  # refused now rather than at export
        return cfg
    from draftsmith.serve.drafters.medusa import medusa_config
    return medusa_config(target, num_heads=m.num_speculative_tokens, num_layers=m.medusa_num_layers,
                         draft_vocab_size=m.draft_vocab_size or None)


def continued_config(config: TrainConfig, target) -> HeadConfig:
    """The HeadConfig of model.init_from, a drafter of `target` trained with the same method."""
    cfg = read_config(config.model.init_from)
    check_target_identity(cfg, target)
    if cfg.method != config.model.method:
        raise DraftsmithError(f"model.init_from={config.model.init_from} is an {cfg.method} drafter but "
                              f"model.method={config.model.method}; set model.method={cfg.method}")
    return cfg


def needed_layers(cfg: HeadConfig) -> tuple[int, ...]:
    """Target layers the training step reads: the head's inputs plus FINAL (the target's distribution)."""
    return tuple(dict.fromkeys([*cfg.aux_layer_ids, FINAL]))
