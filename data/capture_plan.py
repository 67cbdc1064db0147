"""`draftsmith data capture --plan`: what a capture asks of each device, from the recipe and the target's config
alone (no weights, no dataset): serve/core/memory_plan.py on data.capture.capture_workload."""
from __future__ import annotations

from data.capture import capture_workload
from data.config import CaptureConfig
from serve.core.memory_plan import MemoryPlan, format_plan, plan_layout, refusal
from serve.core.target_arch import arch_of


def capture_plan(config: CaptureConfig, *, devices: int, per_node: int,
                 device_gib: float) -> tuple[MemoryPlan, str, str | None]:
    """(the plan, its table, None or the one-line refusal naming the smallest layout that fits) of `config` on
    `devices` devices of `device_gib` GiB, `per_node` on each node."""
    from serve.core.launch_target import target_hf_config

    hf_config = target_hf_config(config.target.spec)
    work = capture_workload(config, hf_config)
    arch = arch_of(hf_config)
    has_tp_plan = bool(getattr(hf_config, "base_model_tp_plan", None))
    plan = plan_layout(config.target.parallel, arch, work, world=devices, per_node=per_node, device_gib=device_gib,
                       has_tp_plan=has_tp_plan, tp_size=config.target.tp_size, fsdp_size=config.target.fsdp_size,
                       enforce=False)
    title = (f"data capture of {config.target.spec} ({arch.params_b():.1f}B params, {work.dtype}), layers "
             f"{config.layers}, {config.batch_tokens} tokens per forward, cache {work.cache_dtype}")
    return plan, format_plan(plan, title=title), refusal(plan, arch, work, per_node=per_node, has_tp_plan=has_tp_plan)
