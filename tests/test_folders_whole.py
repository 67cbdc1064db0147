"""Folders written whole or not at all: the trained drafter, a checkpoint saved over one of its step,
the data build's dataset, and scripts/bench/data.py's --out. A full disk or a kill mid-save leaves the earlier
folder whole and no temporary sibling; nothing is removed that the run did not write, unless --overwrite says so."""
from __future__ import annotations

import errno
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import draftsmith.serve.core.whole_folder
import draftsmith.serve.drafters.folder
from draftsmith.data.build import build_dataset
from draftsmith.cli import main
from draftsmith.serve.core.errors import DraftsmithError
from tests.data_fixtures import config_for, prompts, quiet, read, write_jsonl, PROMPTS  # noqa: F401 (fixture)
from tests.train_fixtures import EAGLE3_LAYERS, greedy_rows, save_rows, sharp_target
from draftsmith.train.loop import STATE_NAME, latest_checkpoint, save_checkpoint

ROOT = Path(__file__).resolve().parents[1]


def _files(folder: Path) -> dict[str, str]:
    """relative path -> sha256 of every file under `folder`."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _siblings(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.parent.iterdir() if p.name.startswith(f".{folder.name}."))


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _run(capsys, *argv) -> tuple[int, str]:
    """`draftsmith ARGV` in this process: (exit code, the last line of stderr)."""
    capsys.readouterr()
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exit_info:
        code = exit_info.code
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    return code, lines[-1] if lines else ""


# ------------------------------------------------------------------------------------------- the drafter

@pytest.fixture(scope="module")
def train_inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("whole-train")
    target = sharp_target(root / "target", num_hidden_layers=EAGLE3_LAYERS)  # tiny.yaml trains EAGLE-3
    return target, save_rows(greedy_rows(target, rows=6, new_tokens=12), root / "data")


def _train(capsys, train_inputs, out: Path, *extra) -> tuple[int, str]:
    target, dataset = train_inputs
    return _run(capsys, "train", "--config", ROOT / "configs/debug/tiny.yaml", f"target={target}",
                f"data.dataset={dataset}", f"out_dir={out}", "data.eval_rows=2", *extra)


def test_a_full_disk_during_the_drafter_save_keeps_the_earlier_drafter(capsys, train_inputs, tmp_path, monkeypatch):
    out = tmp_path / "run"
    assert _train(capsys, train_inputs, out)[0] == 0
    earlier = _files(out / "drafter")
    real = draftsmith.serve.drafters.folder.write_text_atomic

    def full(path, text):  # the weights and checksums are written; config.json finds the disk full
        if Path(path).name == "config.json":
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, text)

    monkeypatch.setattr(draftsmith.serve.drafters.folder, "write_text_atomic", full)
    code, line = _train(capsys, train_inputs, out)  # the same command again: it may replace its own drafter
    assert code != 0 and "disk filled" in line and "drafter" in line
    assert _files(out / "drafter") == earlier  # never new weights beside the earlier config
    assert _siblings(out / "drafter") == []
    monkeypatch.undo()
    assert _train(capsys, train_inputs, out)[0] == 0  # the same run, again: no flag needed
    assert _siblings(out / "drafter") == [] and (out / "drafter" / "config.json").is_file()


def test_another_run_replaces_a_finished_drafter_only_with_overwrite(capsys, train_inputs, tmp_path):
    out = tmp_path / "run"
    assert _train(capsys, train_inputs, out)[0] == 0
    earlier = _files(out)
    code, line = _train(capsys, train_inputs, out, "optim.lr=2e-3")
    assert code == 2 and "finished by another run" in line and "optim.lr" in line and "--overwrite" in line
    assert _files(out) == earlier  # refused before any work: nothing written
    assert _train(capsys, train_inputs, out, "optim.lr=2e-3", "--overwrite")[0] == 0
    assert "lr: 0.002" in (out / "drafter" / "config.resolved.yaml").read_text()
    starts = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    starts = [r for r in starts if r.get("event") in ("start", "resumed")]
    assert starts[-1]["event"] == "start" and starts[-1]["step"] == 0  # not resumed from the other run's checkpoint
    assert _siblings(out / "drafter") == []


def test_a_finished_run_given_more_steps_trains_on_without_overwrite(capsys, train_inputs, tmp_path):
    out = tmp_path / "run"
    assert _train(capsys, train_inputs, out, "optim.max_steps=2")[0] == 0
    assert _train(capsys, train_inputs, out, "optim.max_steps=4")[0] == 0  # the same run, trained further
    assert json.loads((out / "drafter" / "training_summary.json").read_text())["steps"] == 4


def test_a_drafter_folder_holding_something_else_is_refused(capsys, train_inputs, tmp_path):
    out = tmp_path / "run"
    (out / "drafter").mkdir(parents=True)
    (out / "drafter" / "notes.txt").write_text("mine")
    code, line = _train(capsys, train_inputs, out, "--overwrite")
    assert code == 2 and "not a drafter" in line
    assert (out / "drafter" / "notes.txt").read_text() == "mine"


# --------------------------------------------------------------------------------------------- checkpoints

class _Accelerator:
    """What save_checkpoint asks of accelerate, in one process: save_state writes a marker of the step's content."""
    is_main_process = True

    def __init__(self, content: str):
        self.content = content

    def wait_for_everyone(self):
        pass

    def save_state(self, folder):
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / "model.bin").write_text(self.content)


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "move-aside"])
def test_a_checkpoint_saved_over_its_step_is_swapped_in(tmp_path, monkeypatch, exchange):
    if not exchange:
        monkeypatch.setattr(draftsmith.serve.core.whole_folder, "_exchange", lambda a, b: False)
    save_checkpoint(_Accelerator("old"), tmp_path, 4, keep=2, extra={"total_steps": 8})
    save_checkpoint(_Accelerator("new"), tmp_path, 4, keep=2, extra={"total_steps": 8})
    final = latest_checkpoint(tmp_path)
    assert final.name == "step_00000004" and (final / "model.bin").read_text() == "new"
    assert sorted(p.name for p in final.parent.iterdir()) == ["step_00000004"]


def test_a_failure_between_the_renames_keeps_the_earlier_checkpoint(tmp_path, monkeypatch):
    save_checkpoint(_Accelerator("old"), tmp_path, 4, keep=2, extra={"total_steps": 8})
    final = tmp_path / "checkpoints" / "step_00000004"
    monkeypatch.setattr(draftsmith.serve.core.whole_folder, "_exchange", lambda a, b: False)
    real = os.rename
    seen: list[list[str]] = []

    def interrupted(src, dst):
        if Path(src).suffix == ".tmp" and Path(dst) == final and not final.exists():  # the earlier one is aside
            seen.append(sorted(p.name for p in final.parent.iterdir()))
            raise KeyboardInterrupt
        return real(src, dst)

    monkeypatch.setattr(os, "rename", interrupted)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(_Accelerator("new"), tmp_path, 4, keep=2, extra={"total_steps": 8})
    monkeypatch.undo()
    assert seen and any(name.startswith(".step_00000004.old-") for name in seen[0])  # kept whole, aside
    assert (final / "model.bin").read_text() == "old" and (final / STATE_NAME).is_file()
    assert sorted(p.name for p in final.parent.iterdir()) == ["step_00000004"]


def test_a_checkpoint_a_killed_swap_had_moved_aside_is_resumed(tmp_path):
    save_checkpoint(_Accelerator("old"), tmp_path, 4, keep=2, extra={"total_steps": 8})
    final = tmp_path / "checkpoints" / "step_00000004"
    os.rename(final, final.with_name(f".{final.name}.old-{_dead_pid()}-0123abcd"))  # killed between the renames
    assert latest_checkpoint(tmp_path) == final and (final / "model.bin").read_text() == "old"


# -------------------------------------------------------------------------------------------- data build

def test_a_full_disk_during_the_dataset_save_keeps_the_earlier_dataset(tmp_path, tiny_target, prompts, monkeypatch):
    import datasets

    out = tmp_path / "ds"
    build_dataset(tiny_target, config_for(prompts), out_dir=out, progress=False, log=quiet)
    (out / "notes.txt").write_text("the user's")
    earlier, rows = _files(out), read(out)
    more = write_jsonl(tmp_path / "more.jsonl", PROMPTS + [{"id": "f", "domain": "math", "prompt": "3+4?"}])
    real = datasets.Dataset.save_to_disk

    def full(self, folder, **kw):
        real(self, folder, **kw)  # written, then the disk fills (the state file, say)
        raise OSError(errno.ENOSPC, "No space left on device", str(folder))

    monkeypatch.setattr(datasets.Dataset, "save_to_disk", full)
    with pytest.raises(DraftsmithError, match="disk filled"):
        build_dataset(tiny_target, config_for(more), out_dir=out, progress=False, log=quiet)
    monkeypatch.undo()
    assert read(out) == rows and _siblings(out) == []
    new_parts = {k for k in _files(out) if k not in earlier}
    assert all(k.startswith(".work/part-") for k in new_parts)  # the row answered meanwhile is kept for a rerun
    dataset = {k: v for k, v in earlier.items() if not k.startswith(".work/")}
    assert {k: v for k, v in _files(out).items() if k in dataset} == dataset  # dataset, build info, user's file
    result = build_dataset(tiny_target, config_for(more), out_dir=out, progress=False, log=quiet)
    assert read(out)["id"] == ["a", "b", "c", "d", "e", "f"] and result.generated_tokens == 0  # all reused
    assert (out / "notes.txt").read_text() == "the user's" and _siblings(out) == []


def test_a_dataset_no_build_kept_rows_of_is_replaced_only_with_overwrite(tmp_path, tiny_target, prompts):
    out = save_rows([{"id": "x", "domain": "code", "input_ids": [1, 2, 3], "loss_mask": [0, 1, 1]}], tmp_path / "ds")
    earlier = _files(out)
    with pytest.raises(DraftsmithError, match="--overwrite"):
        build_dataset(tiny_target, config_for(prompts), out_dir=out, progress=False, log=quiet)
    assert _files(out) == earlier
    lines: list[str] = []
    build_dataset(tiny_target, config_for(prompts), out_dir=out, progress=False, log=lines.append, overwrite=True)
    assert read(out)["id"] == ["a", "b", "c", "d", "e"] and any("--overwrite replaces" in m for m in lines)


# ------------------------------------------------------------------------------------- scripts/bench/data.py

def test_the_data_bench_removes_only_what_it_wrote(tmp_path):
    from draftsmith.bench.data import MARKER, prepare_out

    theirs = tmp_path / "results"
    theirs.mkdir()
    (theirs / "thesis.tex").write_text("months of work")
    with pytest.raises(SystemExit, match="not an output of this benchmark"):
        prepare_out(theirs)
    assert sorted(p.name for p in theirs.iterdir()) == ["thesis.tex"]

    own = prepare_out(tmp_path / "bench")
    (own / "data").mkdir()
    (own / "cache-eagle3-bf16").mkdir()
    (own / "bench_data.json").write_text("{}")
    (own / "notes.txt").write_text("added by hand")
    prepare_out(own)  # a rerun: its own outputs go, the rest stays
    assert sorted(p.name for p in own.iterdir()) == [MARKER, "notes.txt"]
