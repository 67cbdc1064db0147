"""`draftsmith data capture --plan`: what a capture asks of each device, from the recipe and the target's config
alone (no weights, no dataset): serve/core/memory_plan.py on data.capture.capture_workload."""
from __future__ import annotations

from draftsmith.data.capture import capture_workload
from draftsmith.data.config import CaptureConfig
from draftsmith.serve.core.memory_plan import MemoryPlan, plan_report


def capture_plan(config: CaptureConfig, *, devices: int, per_node: int,
                 device_gib: float) -> tuple[MemoryPlan, str, str | None]:
    """(the plan, its table, None or the one-line refusal naming the smallest layout that fits) of `config` on
    `devices` devices of `device_gib` GiB, `per_node` on each node."""
    from draftsmith.serve.core.launch_target import target_hf_config

    hf_config = target_hf_config(config.target.spec)
    work = capture_workload(config, hf_config)
    return plan_report(config.target, hf_config, work, devices=devices, per_node=per_node, device_gib=device_gib,
                       title=lambda arch: f"data capture of {config.target.spec} ({arch.params_b():.1f}B params, "
                                          f"{work.dtype}), layers {config.layers}, {config.batch_tokens} tokens per "
                                          f"forward, cache {work.cache_dtype}")
