"""`data capture` of a target split over CPU processes (gloo) by FSDP2 or transformers' TP plans equals one
process's capture: llama under FSDP and under TP groups that are data parallel, Qwen3-MoE under TP (experts split).
Every layout over 2 and 4 processes forwards in lock-step equal to the whole model in tests/test_sharded_launch.py."""
from __future__ import annotations

import pytest

from tests.sharded_fixtures import CAPTURE, EAGLE3_LAYERS, captured_once, max_difference, split_target, torchrun

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_target_factory):
    root = tmp_path_factory.mktemp("sharded-capture")
    target = split_target(tiny_target_factory)
    dataset, one = captured_once(root, target)
    return target, dataset, one, root


@pytest.mark.parametrize("nproc,parallel,extra,layout", [
    (2, "fsdp", [], "fsdp: fsdp=2 over 2"),
    (4, "tp", ["capture.target.tp_size=2"], "tp: tp=2 x replicas=2 over 4")])  # two TP groups, data parallel
def test_split_capture_equals_one_process(setup, nproc, parallel, extra, layout):
    target, dataset, one, root = setup
    out = root / f"{parallel}{nproc}"
    done = torchrun(nproc, "-m", "draftsmith.cli", "data", "capture", "--target", str(target), "--dataset",
                    str(dataset), "--out", str(out), *CAPTURE, f"capture.target.parallel={parallel}", *extra)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"layout: {layout} device(s)" in done.stderr
    diff = max_difference(one, out)
    print(f"capture {layout}: max abs diff {diff:.2e}")
    assert diff <= 1e-5


@pytest.mark.parametrize("family,parallel", [("qwen3_moe", "tp")])
def test_other_families_split_and_capture_the_same(tmp_path, tiny_target_factory, family, parallel):
    """Qwen3-MoE (q/k norms replicated) with its experts split over the TP group (expert parallelism)."""
    target = tiny_target_factory(family, num_hidden_layers=EAGLE3_LAYERS)
    dataset, one = captured_once(tmp_path, target, rows=4)
    done = torchrun(2, "-m", "draftsmith.cli", "data", "capture", "--target", str(target), "--dataset", str(dataset),
                    "--out", str(tmp_path / "two"), *CAPTURE, f"capture.target.parallel={parallel}")
    assert done.returncode == 0, done.stderr[-3000:]
    if family == "qwen3_moe" and parallel == "tp":
        assert "(experts ep=2)" in done.stderr
    diff = max_difference(one, tmp_path / "two")
    print(f"capture {family} {parallel} x2: max abs diff {diff:.2e}")
    assert diff <= 1e-5
