"""The target of a launch of `data capture` or `train`: its memory plan first (from the config alone), then the
target loaded whole on every process or split as `target.parallel` says, with every process checked to hold the
same recipe and the same target files before any weight is read."""
from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable

from draftsmith.serve.core.memory_plan import GIB, MemoryPlan, Workload, format_plan, plan_layout
from draftsmith.serve.core.process_group import check_same, launch
from draftsmith.serve.core.target_arch import arch_of
from draftsmith.serve.core.target_config import TargetConfig


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def device_memory_gib(device: str) -> float:
    """Memory of this process's device: the GPU's, or on CPUs the host's share of each process of this node."""
    import torch

    if device.startswith("cuda"):
        return torch.cuda.get_device_properties(launch().local_rank).total_memory / GIB
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return total / GIB / max(launch().local_world, 1)


def recipe_hash(recipe: dict) -> str:
    """sha256 (16 hex) of a resolved config (what every process of a launch must agree on)."""
    return hashlib.sha256(json.dumps(recipe, sort_keys=True, default=str).encode()).hexdigest()[:16]


def target_files_hash(spec: str) -> str:
    """A fingerprint of a local target folder's files (serve/core/identity.files_fingerprint); other specs (a hub
    id, `demo`) by name, their config and tokenizer hashes being compared once loaded."""
    from draftsmith.serve.core.identity import files_fingerprint

    folder = Path(spec)
    if folder.is_dir():
        return files_fingerprint(folder)
    if folder.is_file():
        return files_fingerprint(folder.parent)
    return spec


def check_launch_inputs(*, recipe: dict, spec: str, extra: dict[str, str] | None = None) -> None:
    """Every process of the launch holds the same recipe (its target's path aside) and the same target files (and
    `extra`); DraftsmithError naming the first difference. Alone it does nothing."""
    if launch().world <= 1:
        return
    # the target is compared by its files: node-local copies under other paths are the same target
    unplaced = {**recipe, "target": {k: v for k, v in recipe.get("target", {}).items() if k != "spec"}}
    values = {"recipe": recipe_hash(unplaced), "target files": target_files_hash(spec), **(extra or {})}
    check_same(values, what={"recipe": "launch every process with the same recipe file and overrides",
                             "target files": f"every node must read the same copy of {spec} (a shared file system, "
                                             f"or copies checked with sha256sum)",
                             "dataset": "every node must read the same dataset"})


def target_hf_config(spec: str) -> Any:
    """The HF config of a target spec without its weights or tokenizer: a built-in config name
    (serve/core/known_configs.py), a folder holding config.json, or whatever load_target reads (a hub id, `demo`)."""
    from transformers import AutoConfig

    from draftsmith.serve.core.known_configs import known_config

    builtin = known_config(spec)
    if builtin is not None:
        model_type = builtin.pop("model_type")
        return AutoConfig.for_model(model_type, **builtin)
    if (Path(spec) / "config.json").is_file():
        return AutoConfig.from_pretrained(spec)
    from draftsmith.serve.core.target import load_target

    return load_target(spec, weights=False).config


def launch_plan(config: TargetConfig, *, workload: Callable[[Any], Workload], device: str,
                enforce: bool = True) -> tuple[MemoryPlan, Any]:
    """(the memory plan of this launch for `config.parallel`, the target's HF config), from the config alone."""
    here = launch()
    hf_config = target_hf_config(config.spec)
    arch = arch_of(hf_config)
    plan = plan_layout(config.parallel, arch, workload(hf_config), world=here.world, per_node=here.local_world,
                       device_gib=device_memory_gib(device), has_tp_plan=bool(getattr(hf_config, "base_model_tp_plan", None)),
                       tp_size=config.tp_size, fsdp_size=config.fsdp_size, enforce=enforce)
    return plan, hf_config


def load_launch_target(config: TargetConfig, *, dtype: str, device: str, workload: Callable[[Any], Workload],
                       top1: bool = False, log: Callable[[str], None] | None = None) -> Any:
    """The target for this process: whole (one process, or target.parallel=none), else split as the plan's layout
    says after the plan was printed (main process) and found to fit."""
    from draftsmith.serve.core.target import load_target

    here = launch()
    if here.world == 1 or config.parallel == "none":
        return load_target(config.spec, dtype=dtype, device=device)
    plan, _ = launch_plan(config, workload=workload, device=device)
    if here.is_main:
        (log or _stderr)(format_plan(plan, title=f"memory plan of {config.spec} ({here.world} processes)"))
    return load_target(config.spec, dtype=dtype, device=device, layout=plan.layout, top1=top1)
