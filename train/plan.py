"""`draftsmith train --plan`: what a training run asks of each device, from the recipe and the target's config alone
(no weights): the head is built on the meta device to count its parameters, the rest is serve/core/memory_plan.py."""
from __future__ import annotations

from typing import Any

import torch

from draftsmith.serve.core.memory_plan import MemoryPlan, Workload, plan_report
from draftsmith.serve.core.target import Target
from draftsmith.serve.core.target_config import text_config
from draftsmith.serve.methods.registry import method
from draftsmith.train.config import TrainConfig, precision_on


def head_size(config: TrainConfig, hf_config: Any) -> tuple[int, Any]:
    """(trainable parameters, HeadConfig) of the head `config` trains on a target of `hf_config`."""
    from draftsmith.serve.drafters.folder import build_head
    from draftsmith.train.heads import head_config

    cfg = head_config(config, Target.of_config(hf_config, name=config.target.spec))
    with torch.device("meta"):
        head = build_head(cfg)
    return sum(p.numel() for p in head.parameters() if p.requires_grad), cfg


def train_workload(config: TrainConfig, hf_config: Any, *, precision: str) -> Workload:
    """The Workload of `config` (serve/core/memory_plan.py) in `precision` (fp32 | bf16)."""
    from draftsmith.train.heads import needed_layers

    params, cfg = head_size(config, hf_config)
    unroll = method(cfg.method).unroll(config.model, cfg, config.data.max_length)
    return Workload(task="train", dtype="bfloat16" if precision == "bf16" else "float32",
                    tokens=config.optim.batch_size * config.data.max_length, stored_layers=len(needed_layers(cfg)),
                    online=config.data.mode == "online", head_params=params,
                    head_vocab=cfg.draft_vocab_size or text_config(hf_config).vocab_size,
                    head_intermediate=int((cfg.layer_config or {}).get("intermediate_size", 0)), unroll=unroll)


def plan_device(config: TrainConfig) -> str:
    """The device kind `--plan` describes: the recipe's target.device, where `auto` means the GPUs the launch is sized
    for (the plan's devices are GPUs of --device-memory GiB), whatever this machine has."""
    return "cpu" if config.target.device == "cpu" else "cuda"


def train_plan(config: TrainConfig, *, devices: int, per_node: int,
               device_gib: float) -> tuple[MemoryPlan, str, str | None]:
    """(the plan, its table, None or the one-line refusal naming the smallest layout that fits) of `config` on
    `devices` devices of `device_gib` GiB, `per_node` on each node."""
    from draftsmith.serve.core.launch_target import target_hf_config

    hf_config = target_hf_config(config.target.spec)
    device = plan_device(config)
    precision = precision_on(config, device)
    work = train_workload(config, hf_config, precision=precision)
    return plan_report(config.target, hf_config, work, devices=devices, per_node=per_node, device_gib=device_gib,
                       title=lambda arch: f"train {config.model.method} on {config.target.spec} "
                                          f"({arch.params_b():.1f}B params, {precision} on {device} devices), "
                                          f"{config.data.mode}, "
                                          f"{config.optim.batch_size} x {config.data.max_length} tokens per process")
