"""Online training on a target split over CPU processes (gloo): FSDP2 and transformers' TP plans give the losses of
one process over the same global batches, step by step (EAGLE-3 under FSDP over 2 and TP over 4 processes; Medusa,
which starts from the target's lm_head, under TP over 2)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.train_fixtures import EAGLE3_LAYERS, greedy_rows, save_rows, sharp_target

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.distributed
STEPS = 20
GLOBAL_BATCH = 4


def overrides(target, dataset, out_dir, batch_size: int, *, method: str = "eagle3", steps: int = STEPS) -> list[str]:
    return [f"target={target}", f"data.dataset={dataset}", f"out_dir={out_dir}", f"model.method={method}",
            "model.ttt_steps=2", "model.num_speculative_tokens=2", f"optim.batch_size={batch_size}",
            f"optim.max_steps={steps}", "optim.lr=3e-3", "data.eval_rows=3", "tracking=none", "log.progress=false",
            "log.every=1", "checkpoint.every=0", "device=cpu", "seed=1"]


def launch(nproc: int, args: list[str]) -> subprocess.CompletedProcess:
    if nproc == 1:
        cmd = [sys.executable, "-m", "draftsmith.cli", "train", *args]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc), "-m",
               "draftsmith.cli", "train", *args]
    return subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=300)


def env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline", "PYTHONPATH": str(ROOT),
            "TOKENIZERS_PARALLELISM": "false"}


def losses(out_dir: Path) -> list[float]:
    records = [json.loads(line) for line in (out_dir / "train_log.jsonl").read_text().splitlines()]
    return [r["loss"] for r in records if "loss" in r and r.get("event") not in ("eval", "start")]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("sharded-train")
    target = sharp_target(root / "target", num_hidden_layers=EAGLE3_LAYERS, num_key_value_heads=4)  # TP x4 splits 4
    dataset = save_rows(greedy_rows(target, rows=13, new_tokens=16), root / "data")
    done = launch(1, overrides(target, dataset, root / "one", GLOBAL_BATCH))
    assert done.returncode == 0, done.stderr[-3000:]
    reference = losses(root / "one")
    assert len(reference) == STEPS
    return target, dataset, root, reference


@pytest.mark.parametrize("parallel,nproc", [("fsdp", 2), ("tp", 4)])
def test_sharded_training_gives_the_losses_of_one_process(setup, parallel, nproc):
    target, dataset, root, reference = setup
    out = root / f"{parallel}{nproc}"
    done = launch(nproc, [*overrides(target, dataset, out, GLOBAL_BATCH // nproc), f"target.parallel={parallel}"])
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"layout: {parallel}: " in done.stdout + done.stderr
    got = losses(out)
    worst = max(abs(a - b) for a, b in zip(reference, got))
    print(f"train {parallel} x{nproc}: {len(got)} steps, max loss difference {worst:.2e}")
    assert len(got) == STEPS and worst <= 1e-4
    assert (out / "drafter" / "model.safetensors").is_file()


@pytest.mark.parametrize("method,parallel", [("medusa", "tp")])
def test_heads_that_read_the_lm_head_train_the_same(setup, method, parallel):
    """Medusa's heads start from the target's lm_head (EAGLE-1 reads it every step, as EAGLE-3 reads the target's
    distribution): a whole copy of a split one."""
    target, dataset, root, _ = setup
    steps = 6
    one = launch(1, overrides(target, dataset, root / f"{method}-one", GLOBAL_BATCH, method=method, steps=steps))
    assert one.returncode == 0, one.stderr[-3000:]
    out = root / f"{method}-{parallel}"
    two = launch(2, [*overrides(target, dataset, out, GLOBAL_BATCH // 2, method=method, steps=steps),
                     f"target.parallel={parallel}"])
    assert two.returncode == 0, two.stderr[-3000:]
    reference, got = losses(root / f"{method}-one"), losses(out)
    worst = max(abs(a - b) for a, b in zip(reference, got))
    print(f"train {method} {parallel} x2: {len(got)} steps, max loss difference {worst:.2e}")
    assert len(got) == len(reference) == steps and worst <= 1e-4
