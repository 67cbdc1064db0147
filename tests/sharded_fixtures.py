"""What the tests of a target split over CPU processes share: launching torchrun, a tiny target with its dataset
and one process's capture of it, and comparing two caches."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

from draftsmith.data.capture import CacheReader, capture_hidden_states
from draftsmith.data.config import CaptureConfig
from draftsmith.serve.core.target import load_target
from draftsmith.serve.core.target_config import TargetConfig
from tests.data_fixtures import quiet
from tests.train_fixtures import EAGLE3_LAYERS, greedy_rows, save_rows

ROOT = Path(__file__).resolve().parents[1]
CAPTURE = ["--layers", "eagle3", "--dtype", "fp32", "--no-progress", "capture.rows_per_shard=2",
           "capture.batch_tokens=48", "capture.device=cpu"]


def torchrun(nproc: int, *args: str, timeout: int = 240) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), TOKENIZERS_PARALLELISM="false")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc), *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def captured_once(root: Path, target: Path, *, rows: int = 7) -> tuple[Path, Path]:
    """(dataset, one process's fp32 capture of it) for `target`, under root."""
    dataset = save_rows(greedy_rows(target, rows=rows, new_tokens=12), root / "data")
    config = CaptureConfig(layers="eagle3", storage_dtype="fp32", rows_per_shard=2, batch_tokens=48,
                           target=TargetConfig(device="cpu"))
    capture_hidden_states(load_target(target), dataset, root / "one", config, progress=False, log=quiet)
    return dataset, root / "one"


def split_target(factory) -> Path:
    """The tiny llama of these tests: four key/value heads, since transformers' TP splits whole heads."""
    return factory("llama", num_hidden_layers=EAGLE3_LAYERS, num_key_value_heads=4)


def max_difference(one: Path, other: Path) -> float:
    """The largest |difference| of two caches' hidden states; asserts that all else (rows, ids, top-1) is equal."""
    a, b = CacheReader(one), CacheReader(other)
    assert a.manifest["identity"] == b.manifest["identity"] and len(a) == len(b)
    worst = 0.0
    for x, y in zip(a, b):
        assert x["id"] == y["id"] and torch.equal(x["input_ids"], y["input_ids"])
        assert torch.equal(x["target_top1"], y["target_top1"])
        worst = max(worst, *((x["hidden_states"][i] - y["hidden_states"][i]).abs().max().item() for i in a.layer_ids))
    return worst
