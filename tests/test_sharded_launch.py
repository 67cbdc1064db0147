"""A launch over a split target (CPU processes, gloo): uneven lock-step forwards stay in step and equal the whole
model; each process holds its share of the weights; processes that disagree on the recipe or the target files, a TP
size that does not divide the heads, and a process lost mid-capture."""
from __future__ import annotations

import json
import shutil

import pytest

from tests.sharded_fixtures import CAPTURE, ROOT, captured_once, max_difference, split_target, torchrun

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_target_factory):
    root = tmp_path_factory.mktemp("sharded-launch")
    target = split_target(tiny_target_factory)
    dataset, one = captured_once(root, target)
    return target, dataset, one


@pytest.mark.parametrize("parallel", ["fsdp", "tp"])
def test_lock_step_forwards_and_weights_per_process(setup, tmp_path, parallel):
    """Four processes making 1..4 forwards of different shapes each: equal to the whole model; each holds at most
    35% of the weights (1/4 and what is replicated), after the forwards too."""
    target = setup[0]
    done = torchrun(4, str(ROOT / "tests" / "sharded_probe.py"), str(target), parallel, "0", "0", str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    for rank in range(4):
        report = json.loads((tmp_path / f"rank{rank}.json").read_text())
        held = max(report["held"], report["held_after"])
        print(f"{report['layout']}: rank {rank} holds {held} of {report['full']} bytes ({held / report['full']:.1%}), "
              f"max abs diff {report['max_diff']:.2e}")
        assert report["max_diff"] <= 1e-5 and report["top1_equal"] and held <= 0.35 * report["full"]


def test_processes_that_disagree_are_refused_before_any_work(setup, tmp_path):
    target, dataset, _ = setup
    other = tmp_path / "other-target"
    shutil.copytree(target, other)
    weights = other / "model.safetensors"
    blob = bytearray(weights.read_bytes())
    blob[-8:] = bytes(8)  # same files, same sizes, other weights
    weights.write_bytes(bytes(blob))
    base = ["--target", str(target), "--dataset", str(dataset), *CAPTURE, "capture.target.parallel=fsdp"]
    recipe = torchrun(2, str(ROOT / "tests" / "rank_args.py"), "data", "capture", "--out", str(tmp_path / "a"),
                      *base, "--rank1", "capture.rows_per_shard=3")
    assert recipe.returncode != 0 and "error: the processes disagree on the recipe" in recipe.stderr
    files = torchrun(2, str(ROOT / "tests" / "rank_args.py"), "data", "capture", "--out", str(tmp_path / "b"),
                     *base, "--rank1", "--target", str(other))
    assert files.returncode != 0 and "error: the processes disagree on the target files" in files.stderr
    assert not list((tmp_path / "a").glob("shard-*")) and not list((tmp_path / "b").glob("shard-*"))


def test_a_tp_size_that_does_not_divide_the_heads_is_one_line(setup, tmp_path):
    target, dataset, _ = setup
    done = torchrun(3, "-m", "draftsmith.cli", "data", "capture", "--target", str(target), "--dataset", str(dataset),
                    "--out", str(tmp_path / "c"), *CAPTURE, "capture.target.parallel=tp")
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode != 0 and errors, done.stderr[-2000:]
    assert "tp=3 does not divide the 4 attention heads" in errors[0] and "[2, 4]" in errors[0]


def test_a_process_lost_mid_capture_resumes_shard_by_shard(setup, tmp_path):
    """Rank 1 dies before its second shard: the launch stops; the same capture run again (here split by TP
    instead of FSDP) keeps every finished shard and ends equal to one process's."""
    target, dataset, one = setup
    out = tmp_path / "resumed"
    args = ["data", "capture", "--target", str(target), "--dataset", str(dataset), "--out", str(out), *CAPTURE]
    died = torchrun(2, str(ROOT / "tests" / "die_after_shard.py"), *args, "capture.target.parallel=fsdp")
    assert died.returncode != 0
    kept = {p.with_suffix(".safetensors").name: p.with_suffix(".safetensors").stat().st_mtime_ns
            for p in out.glob("shard-*.json")}  # finished shards: a sidecar is written after its shard
    assert kept and not (out / "manifest.json").exists()
    again = torchrun(2, "-m", "draftsmith.cli", *args, "capture.target.parallel=tp")
    assert again.returncode == 0, again.stderr[-3000:]
    assert all((out / name).stat().st_mtime_ns == mtime for name, mtime in kept.items())  # kept, not redone
    assert max_difference(one, out) <= 1e-5
