"""Checkpoint and resume: after kill -9 the same command resumes and ends with the same weights as an
uninterrupted run (CPU, same seed)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from draftsmith.cli import main
from tests.train_fixtures import greedy_rows, save_rows, sharp_target

ROOT = Path(__file__).resolve().parents[1]


def _command(target, dataset, out_dir) -> list[str]:
    return [sys.executable, "-m", "draftsmith.cli", *_args(target, dataset, out_dir)]


def _args(target, dataset, out_dir) -> list[str]:
    return ["train", f"target={target}", f"data.dataset={dataset}",
            f"out_dir={out_dir}", "model.method=eagle1", "model.num_speculative_tokens=2", "optim.batch_size=2",
            "optim.max_steps=40", "optim.lr=3e-3", "optim.warmup_steps=2", "checkpoint.every=4", "checkpoint.keep=1",
            "data.eval_rows=2", "tracking=none", "log.progress=false", "log.every=1", "seed=3"]


def _env():
    return {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline", "PYTHONPATH": str(ROOT)}


@pytest.fixture(scope="module")
def resume_setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume")
    target = sharp_target(root / "target")
    return target, save_rows(greedy_rows(target, rows=10, new_tokens=24), root / "data"), root


def test_kill_and_resume_ends_with_the_same_weights(resume_setup):
    target, dataset, root = resume_setup
    straight = root / "straight"
    assert main(_args(target, dataset, straight)) == 0  # uninterrupted, in this process

    resumed = root / "resumed"
    proc = subprocess.Popen(_command(target, dataset, resumed), cwd=ROOT, env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    # any finished checkpoint (keep=1 deletes older ones as newer land)
    while not [p for p in (resumed / "checkpoints").glob("step_*") if p.suffix != ".tmp"] \
            and time.time() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the run ended before it could be killed: {proc.stderr.read()[-2000:]}")
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (resumed / "drafter").exists(), "the run finished before it could be killed"
    assert list((resumed / "checkpoints").glob("step_*"))

    assert main(_args(target, dataset, resumed)) == 0  # the same command again: resumes
    log = (resumed / "train_log.jsonl").read_text()
    assert '"event": "resumed"' in log
    a = load_file(str(straight / "drafter" / "model.safetensors"))
    b = load_file(str(resumed / "drafter" / "model.safetensors"))
    assert a.keys() == b.keys()
    for name in a:
        assert (a[name] == b[name]).all(), name
