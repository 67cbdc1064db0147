"""Two CPU processes (gloo DDP through accelerate launch; DeepSpeed ZeRO-2 when installed) end with the same
weights as one process over the same global batches."""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.train_fixtures import EAGLE3_LAYERS, greedy_rows, save_rows, sharp_target

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.distributed


def _overrides(target, dataset, out_dir, batch_size: int, method: str = "eagle3") -> list[str]:
    return [f"target={target}", f"data.dataset={dataset}", f"out_dir={out_dir}", f"model.method={method}",
            *(["model.block_size=3", "model.anchors=8"] if method == "dflash" else
              ["model.anchors=8"] if method == "peagle" else ["model.ttt_steps=2"]),
            "model.num_speculative_tokens=2", f"optim.batch_size={batch_size}",
            "optim.max_steps=4", "optim.lr=3e-3", "data.eval_rows=2", "tracking=none", "log.progress=false",
            "checkpoint.every=0", "device=cpu", "seed=1"]


def _env():
    return {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline", "PYTHONPATH": str(ROOT)}


def _accelerate_launch(args: list[str], *, use_cpu_flag: bool = True) -> subprocess.CompletedProcess:
    """2 CPU processes. ACCELERATE_USE_CPU makes accelerate ignore DeepSpeed, so DeepSpeed runs go without it
    (no CUDA here: accelerate and DeepSpeed then run on CPU over gloo)."""
    launcher = shutil.which("accelerate", path=str(Path(sys.executable).parent)) or "accelerate"
    cmd = [launcher, "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision",
           "no", "--dynamo_backend", "no", "--main_process_port", "29517", "-m", "draftsmith.cli", "train", *args]
    env = {**_env(), **({"ACCELERATE_USE_CPU": "true"} if use_cpu_flag else {})}
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("dist")
    target = sharp_target(root / "target", num_hidden_layers=EAGLE3_LAYERS)
    dataset = save_rows(greedy_rows(target, rows=10, new_tokens=20), root / "data")
    single = root / "single"
    subprocess.run([sys.executable, "-m", "draftsmith.cli", "train", *_overrides(target, dataset, single, 4)],
                   cwd=ROOT, env=_env(), check=True, capture_output=True, timeout=300)
    return target, dataset, root, load_file(str(single / "drafter" / "model.safetensors"))


def _assert_close(reference: dict, folder: Path):
    other = load_file(str(folder / "drafter" / "model.safetensors"))
    assert reference.keys() == other.keys()
    for name, tensor in reference.items():
        if tensor.is_floating_point():
            assert torch.allclose(tensor, other[name], atol=2e-5, rtol=1e-4), name
        else:
            assert torch.equal(tensor, other[name]), name


def test_two_process_ddp_matches_one_process(setup):
    target, dataset, root, reference = setup
    done = _accelerate_launch(_overrides(target, dataset, root / "ddp", 2))
    assert done.returncode == 0, done.stderr[-3000:]
    _assert_close(reference, root / "ddp")
    log = (root / "ddp" / "train_log.jsonl").read_text()
    assert log.count('"event": "eval"') == 2  # one log, written by the main process only
    assert '"processes": 2' in log


@pytest.mark.parametrize("method", ["dflash", "peagle", "mtp"])
def test_two_process_ddp_trains_anchored_methods_as_one_process(setup, method):
    """DFlash's and P-EAGLE's random anchors are drawn from each row's own seed: two processes draw the ones one
    process does; an MTP layer (the target's own family's decoder layer, its experts' parameters included) trains
    under DDP as in one process."""
    target, dataset, root, _ = setup
    subprocess.run([sys.executable, "-m", "draftsmith.cli", "train",
                    *_overrides(target, dataset, root / f"{method}-single", 4, method)],
                   cwd=ROOT, env=_env(), check=True, capture_output=True, timeout=300)
    done = _accelerate_launch(_overrides(target, dataset, root / f"{method}-ddp", 2, method))
    assert done.returncode == 0, done.stderr[-3000:]
    _assert_close(load_file(str(root / f"{method}-single" / "drafter" / "model.safetensors")), root / f"{method}-ddp")


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None,
                    reason="deepspeed is not installed (pip install 'draftsmith[deepspeed]')")
def test_two_process_deepspeed_zero2_matches_one_process(setup):
    target, dataset, root, reference = setup
    done = _accelerate_launch(_overrides(target, dataset, root / "zero2", 2) + ["distributed.strategy=deepspeed"],
                              use_cpu_flag=False)
    assert done.returncode == 0, done.stderr[-3000:]
    _assert_close(reference, root / "zero2")
    assert (root / "zero2" / "deepspeed_config.json").is_file()
    log = (root / "zero2" / "train_log.jsonl").read_text()
    assert "DEEPSPEED" in log and '"processes": 2' in log
