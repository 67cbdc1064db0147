"""The memory plan and the parallel layouts as pure functions: parameter counts from a config alone, layouts that
divide or refuse, plans that fit or name the smallest layout that would, and the --plan command line."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from draftsmith.serve.core.errors import ConfigError
from draftsmith.serve.core.known_configs import KNOWN_CONFIGS, known_config
from draftsmith.serve.core.memory_plan import (GIB, Workload, candidate_layouts, choose_layout, plan_layout,
                                               plan_memory, refusal, smallest_fitting)
from draftsmith.serve.core.parallel_layout import Layout, resolve_layout
from draftsmith.serve.core.target_arch import arch_of
from tests.tiny_models import tiny_config

ROOT = Path(__file__).resolve().parents[1]
CAPTURE = Workload(task="capture", dtype="bf16", tokens=4096, stored_layers=4, shard_tokens=128 * 2048,
                   split_over_tp=True)


def hf_config(name: str):
    from draftsmith.serve.core.launch_target import target_hf_config

    return target_hf_config(name)


@pytest.mark.parametrize("family", ["llama", "qwen3", "qwen3_moe"])
def test_parameter_count_of_tiny_families_is_exact(family):
    from transformers import AutoModelForCausalLM

    config = tiny_config(family)
    model = AutoModelForCausalLM.from_config(config)
    assert arch_of(config).total_params == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", sorted(KNOWN_CONFIGS))
def test_parameter_count_of_builtin_configs_is_exact(name):
    from transformers import AutoModelForCausalLM

    config = hf_config(name)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    assert arch_of(config).total_params == sum(p.numel() for p in model.parameters())


def test_builtin_configs_are_the_published_sizes():
    sizes = {name: round(arch_of(hf_config(name)).params_b(), 1) for name in KNOWN_CONFIGS}
    assert sizes == {"llama-3.1-8b": 8.0, "llama-3.3-70b": 70.6, "qwen3-32b": 32.8, "qwen3-30b-a3b": 30.5}
    assert known_config("meta-llama/Llama-3.3-70B-Instruct")["num_hidden_layers"] == 80
    assert known_config("Qwen/Qwen3-30B-A3B")["num_experts"] == 128 and known_config("nobody/nothing") is None
    moe = arch_of(hf_config("qwen3-30b-a3b"))
    assert moe.is_moe and moe.experts_per_token == 8 and moe.expert_intermediate_size == 768


def test_layouts_divide_the_launch_and_the_heads():
    arch = arch_of(hf_config("llama-3.3-70b"))  # 64 heads, 8 key/value heads
    tp = resolve_layout("tp", world=16, per_node=8, arch=arch)
    assert (tp.tp, tp.fsdp, tp.replicas, tp.data_parallel, tp.shards) == (8, 1, 2, 2, 8)
    both = resolve_layout("tp", world=16, per_node=8, arch=arch, fsdp_size=2)
    assert (both.shards, both.replicas) == (16, 1)
    fsdp = resolve_layout("fsdp", world=16, per_node=8, arch=arch, fsdp_size=8)
    assert (fsdp.fsdp, fsdp.replicas, fsdp.data_parallel) == (8, 2, 16)
    assert not resolve_layout("tp", world=1, per_node=8, arch=arch).sharded
    moe = resolve_layout("tp", world=4, per_node=4, arch=arch_of(hf_config("qwen3-30b-a3b")))
    assert moe.ep == 4
    with pytest.raises(ConfigError, match=r"^tp=3 does not divide the 64 attention heads .* are \[2, 4, 8\]"):
        resolve_layout("tp", world=12, per_node=12, arch=arch, tp_size=3)
    with pytest.raises(ConfigError, match="tp_size=4 does not divide the 6 processes"):
        resolve_layout("tp", world=6, per_node=8, arch=arch, tp_size=4)
    with pytest.raises(ConfigError, match="no tensor-parallel plan .* target.parallel=fsdp"):
        resolve_layout("tp", world=2, per_node=2, arch=arch, has_tp_plan=False)
    with pytest.raises(ConfigError, match="choose one of none, tp, fsdp, auto"):
        resolve_layout("pipeline", world=2, per_node=2, arch=arch)
    tied = hf_config("llama-3.3-70b")
    tied.tie_word_embeddings = True  # SmolLM2, Gemma, the small Qwen3: FSDP leaves the shared matrix sharded
    with pytest.raises(ConfigError, match=r"lm_head shares the embedding .* target.parallel=tp \(sizes \[2, 4, 8\]\)"):
        resolve_layout("fsdp", world=2, per_node=2, arch=arch_of(tied))
    assert resolve_layout("tp", world=2, per_node=2, arch=arch_of(tied)).tp == 2


def test_sharding_divides_the_weights():
    arch = arch_of(hf_config("llama-3.1-8b"))
    one = plan_memory(arch, Layout("none", 1), CAPTURE, device_gib=80)
    four = plan_memory(arch, Layout("fsdp", 4, fsdp=4), CAPTURE, device_gib=80)
    weights = {name: size for name, size, _ in one.lines}["target weights"]
    assert weights == arch.total_params * 2
    assert {name: size for name, size, _ in four.lines}["target weights"] == pytest.approx(weights / 4, abs=1)
    assert "fsdp all-gather" in {name for name, _, _ in four.lines}
    assert one.fits and one.host_lines[0][1] == 128 * 2048 * 4 * 4096 * 2


def test_70b_refused_on_one_device_with_the_smallest_layout():
    arch = arch_of(hf_config("llama-3.3-70b"))
    plan = plan_memory(arch, Layout("none", 1), CAPTURE, device_gib=80)
    assert not plan.fits
    message = refusal(plan, arch, CAPTURE, per_node=8, has_tp_plan=True)
    assert "\n" not in message
    assert message.startswith("none on 1 device(s) of 80 GiB does not fit")
    assert "smallest layout that fits is tp: tp=2" in message and "target.parallel=tp target.tp_size=2" in message
    smallest = smallest_fitting(arch, CAPTURE, per_node=8, device_gib=80, has_tp_plan=True)
    assert smallest.layout.world == 2 and smallest.fits
    without_tp = smallest_fitting(arch, CAPTURE, per_node=8, device_gib=80, has_tp_plan=False)
    assert without_tp.layout.kind == "fsdp" and without_tp.layout.world == 2
    with pytest.raises(ConfigError, match="does not fit"):
        plan_layout("none", arch, CAPTURE, world=1, per_node=8, device_gib=80, has_tp_plan=True)


def test_auto_picks_the_first_layout_that_fits():
    small = arch_of(hf_config("llama-3.1-8b"))
    assert choose_layout(small, CAPTURE, world=8, per_node=8, device_gib=80, has_tp_plan=True).layout.kind == "none"
    big = arch_of(hf_config("llama-3.3-70b"))
    picked = choose_layout(big, CAPTURE, world=8, per_node=8, device_gib=80, has_tp_plan=True)
    assert picked.fits and picked.layout.kind == "tp"
    fsdp_only = choose_layout(big, CAPTURE, world=8, per_node=8, device_gib=80, has_tp_plan=False)
    assert fsdp_only.fits and fsdp_only.layout.kind == "fsdp"
    with pytest.raises(ConfigError, match="smallest layout that fits"):
        choose_layout(big, CAPTURE, world=1, per_node=8, device_gib=80, has_tp_plan=True)
    kinds = [layout.kind for layout in candidate_layouts(big, world=8, per_node=8, has_tp_plan=True)]
    assert kinds[0] == "none" and kinds.index("tp") < kinds.index("fsdp")


def test_training_counts_the_head_and_its_optimizer():
    arch = arch_of(hf_config("llama-3.1-8b"))
    work = Workload(task="train", dtype="bf16", tokens=2048, stored_layers=4, head_params=1_000_000,
                    head_vocab=32000, head_intermediate=14336, unroll=7)
    whole = {name: size for name, size, _ in plan_memory(arch, Layout("none", 8), work, device_gib=80).lines}
    assert whole["head weights"] == 4_000_000 and whole["head gradients + AdamW"] == 12_000_000
    assert "frozen embeddings + lm_head" not in whole  # the head reads the target's own tensors
    split = {name: size for name, size, _ in
             plan_memory(arch, Layout("fsdp", 8, fsdp=8), work, device_gib=80).lines}
    assert split["frozen embeddings + lm_head"] == 2 * arch.embedding_params * 2


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "draftsmith.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_plan_command_line_from_a_builtin_config():
    done = run_cli("data", "capture", "--target", "llama-3.3-70b", "--plan", "--devices", "8",
                   "capture.target.parallel=tp", "capture.target.dtype=bf16")
    assert done.returncode == 0, done.stderr
    assert "layout: tp: tp=8 over 8 device(s)" in done.stdout and ": fits" in done.stdout
    refused = run_cli("data", "capture", "--target", "llama-3.3-70b", "--plan", "--devices", "1",
                      "--device-memory", "80", "capture.target.dtype=bf16")
    assert refused.returncode == 2 and "DOES NOT FIT" in refused.stdout
    error = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "smallest layout that fits is tp: tp=2" in error[0]


def test_train_plan_of_a_tiny_folder(tiny_target_factory):
    folder = tiny_target_factory("llama", num_hidden_layers=4)
    done = run_cli("train", "--plan", "--devices", "2", f"target={folder}", "target.parallel=fsdp",
                   "model.method=eagle3", "optim.batch_size=2", "data.max_length=64", "device=cpu")
    assert done.returncode == 0, done.stderr
    assert "layout: fsdp: fsdp=2 over 2 device(s)" in done.stdout
    for part in ("head weights", "head gradients + AdamW", "frozen embeddings + lm_head", "target activations"):
        assert part in done.stdout
    assert f"{GIB}" not in done.stdout



@pytest.mark.parametrize("device,precision", [("cpu", "auto"), ("auto", "auto"), ("cpu", "bf16"), ("auto", "fp32")])
def test_the_plan_and_the_run_resolve_one_precision(device, precision, monkeypatch):
    """One rule (train/config.py precision_on): `--plan` sizes the precision the run computes in, on the device it
    describes: the CPU for target.device=cpu, the launch's GPUs for auto (whatever this machine has)."""
    from draftsmith.serve.core.config import load_config
    from draftsmith.train import loop
    from draftsmith.train.config import TrainConfig
    from draftsmith.train.plan import plan_device

    config = load_config(TrainConfig, overrides=[f"device={device}", f"distributed.precision={precision}"])
    described = plan_device(config)
    assert described == ("cpu" if device == "cpu" else "cuda")
    monkeypatch.setattr(loop, "resolve_device", lambda config: described)  # the run, on the device the plan describes
    expected = precision if precision != "auto" else ("fp32" if described == "cpu" else "bf16")
    assert loop.resolve_precision(config) == expected
    table = [line for line in _plan_table(config) if "B params" in line]
    assert f"{expected} on {described} devices" in table[0], table

LARGE_RECIPES = {"llama-3.1-8b": (1, 8), "llama-3.3-70b": (8,), "qwen3-32b": (8,), "qwen3-30b-a3b": (4, 8)}


@pytest.mark.parametrize("name", sorted(LARGE_RECIPES))
def test_the_large_target_recipes_fit_80gb_devices(name):
    from draftsmith.data.capture_plan import capture_plan
    from draftsmith.data.config import CaptureConfig
    from draftsmith.serve.core.config import load_config
    from draftsmith.train.config import TrainConfig, check
    from draftsmith.train.plan import train_plan

    train = check(load_config(TrainConfig, config_file=str(ROOT / "configs" / name / "eagle3.yaml"), overrides=[]),
                  data=False)
    capture = load_config(CaptureConfig, config_file=str(ROOT / "configs" / name / "capture.yaml"), section="capture",
                          overrides=[f"target.spec={name}"])
    for devices in LARGE_RECIPES[name]:
        for plan, _, error in (train_plan(train, devices=devices, per_node=8, device_gib=80),
                               capture_plan(capture, devices=devices, per_node=8, device_gib=80)):
            assert plan.fits and error is None, (devices, plan.layout, plan.total / GIB)
            assert plan.layout.sharded == (name != "llama-3.1-8b")


def _plan_table(config) -> list[str]:
    from draftsmith.train.plan import train_plan

    config.target.spec = "llama-3.1-8b"
    _, table, _ = train_plan(config, devices=1, per_node=1, device_gib=80.0)
    return table.splitlines()
