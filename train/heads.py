"""Which head a recipe trains on a target: its HeadConfig (fresh, or continued from model.init_from) and the target
layers its training step reads."""
from __future__ import annotations

from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.core.layers import FINAL
from draftsmith.serve.drafters.folder import read_config
from draftsmith.serve.drafters.head_config import HeadConfig
from draftsmith.serve.drafters.identity import check_target_identity
from draftsmith.serve.methods.registry import method
from draftsmith.train.config import TrainConfig
from draftsmith.serve.core.target import Target


def head_config(config: TrainConfig, target: Target) -> HeadConfig:
    """A fresh head of model.method for `target`, as its method folder builds it from the recipe's model section."""
    return method(config.model.method, what="model.method", trained=True).config(config.model, target)


def continued_config(config: TrainConfig, target: Target) -> HeadConfig:
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
