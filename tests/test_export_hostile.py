"""Exports under hostile conditions end in one line or a whole, validated folder, and never lose a file that was
there before: an extra file beside an earlier export, another export over it (--overwrite), a full disk, a
read-only folder, two exports racing into one folder, what a killed export left behind, a truncated drafter, and a
`target.*` override on the command line."""
from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

import draftsmith.serve.core.threads
import draftsmith.serve.core.target
from draftsmith.cli import main
from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.drafters.folder import verify_weights
from draftsmith.serve.export import export_drafter, validate_export
from draftsmith.serve.export.common import default_prompts
from tests.export_fixtures import make_native, target  # noqa: F401 (fixture)


@pytest.fixture(scope="module")
def natives(target, tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile-natives")
    return {"eagle3": make_native(target, "eagle3", root / "eagle3", seed=1),
            "eagle1": make_native(target, "eagle1", root / "eagle1", seed=2)}


def _run(capsys, *argv) -> tuple[int, str, str]:
    """`draftsmith ARGV` in this process: (exit code, stdout, the last line of stderr)."""
    capsys.readouterr()
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exit_info:
        code = exit_info.code
    out, err = capsys.readouterr()
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    return code, out, lines[-1] if lines else ""  # transformers' loading bar may precede it


def _export(capsys, target, drafter, fmt, out, *extra):
    return _run(capsys, "export", "--drafter", drafter, "--format", fmt, "--out", out, "--target", target.path,
                "--prompts", 1, "--max-new-tokens", 4, "--k", 2, *extra)


def _files(folder: Path) -> dict[str, str] | None:
    """name -> sha256 of every file in `folder` (None when it does not exist)."""
    if not folder.exists():
        return None
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def _siblings(folder: Path) -> list[str]:
    """Temporary or set-aside folders an export left beside `folder`."""
    return sorted(p.name for p in folder.parent.iterdir() if p.name.startswith(f".{folder.name}."))


def _provenance(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())["draftsmith_export"]


@pytest.fixture
def earlier(capsys, target, natives, tmp_path):
    """An out folder holding a whole vLLM export of the EAGLE-3 drafter."""
    out = tmp_path / "out"
    assert _export(capsys, target, natives["eagle3"], "vllm", out)[0] == 0
    return out


@pytest.mark.parametrize("overwrite", [(), ("--overwrite",)], ids=["plain", "overwrite"])
def test_an_extra_file_beside_an_earlier_export_is_refused_and_nothing_is_lost(capsys, target, natives, earlier,
                                                                               overwrite):
    (earlier / "extra.bin").write_bytes(b"user data")
    before = _files(earlier)
    code, _, line = _export(capsys, target, natives["eagle3"], "vllm", earlier, *overwrite)
    assert code == 2
    assert line.startswith(f"error: {earlier} holds a vllm export of eagle3 (drafter {natives['eagle3']}"), line
    assert "['extra.bin']" in line and "nothing was written" in line, line
    assert _files(earlier) == before and _siblings(earlier) == []


@pytest.mark.parametrize("method, fmt", [("eagle3", "sglang"), ("eagle1", "vllm")])
def test_another_export_over_an_export_needs_overwrite_and_names_what_it_replaces(capsys, target, natives, earlier,
                                                                                    method, fmt):
    before = _files(earlier)
    code, _, line = _export(capsys, target, natives[method], fmt, earlier)
    assert code == 2 and line == (f"error: {earlier} holds a vllm export of eagle3 (drafter {natives['eagle3']}, "
                                  f"target {target.name}); pass --overwrite to replace it (nothing was written)")
    assert _files(earlier) == before

    code, out, _ = _export(capsys, target, natives[method], fmt, earlier, "--overwrite")
    assert code == 0
    assert out.splitlines()[0] == (f"{method} -> {fmt}: {earlier} (replaced a vllm export of eagle3 (drafter "
                                   f"{natives['eagle3']}, target {target.name}))")
    assert _provenance(earlier)["format"] == fmt and _provenance(earlier)["method"] == method
    report = json.loads((earlier / "export_report.json").read_text())
    assert report["replaced"].startswith("a vllm export of eagle3") and report["out_dir"] == str(earlier)
    verify_weights(earlier)
    assert _siblings(earlier) == []


def test_a_folder_that_is_not_an_export_is_never_replaced(capsys, target, natives):
    before = _files(natives["eagle3"])  # --out naming the drafter folder itself
    code, _, line = _export(capsys, target, natives["eagle3"], "vllm", natives["eagle3"], "--overwrite")
    assert code == 2 and f"error: {natives['eagle3']} already holds [" in line and "not a draftsmith export" in line
    assert _files(natives["eagle3"]) == before


def _full_disk_at(monkeypatch, stage: str) -> None:
    """The disk fills while the weights (half written) or, after validation, the README are written."""
    real_bytes, real_text = Path.write_bytes, Path.write_text

    def write_bytes(self, data):
        if stage == "weights" and "safetensors" in self.name:
            real_bytes(self, data[: len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_bytes(self, data)

    def write_text(self, data, *args, **kwargs):
        if stage == "readme" and self.name == "README.md":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_text(self, data, *args, **kwargs)

    monkeypatch.setattr(Path, "write_bytes", write_bytes)
    monkeypatch.setattr(Path, "write_text", write_text)


@pytest.mark.parametrize("stage", ["weights", "readme"])
def test_a_full_disk_keeps_nothing_partial_and_the_earlier_export_whole(capsys, monkeypatch, target, natives,
                                                                          earlier, stage):
    before = _files(earlier)
    fresh = earlier.parent / "fresh"
    _full_disk_at(monkeypatch, stage)
    for out, extra in ((earlier, ("--overwrite",)), (fresh, ())):
        code, _, line = _export(capsys, target, natives["eagle1"], "sglang", out, *extra)
        assert code == 2 and line.startswith(f"error: the disk filled while writing {out}; nothing partial of it "
                                             f"was kept"), line
        assert _siblings(out) == []
    assert _files(earlier) == before and not fresh.exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through chmod")
def test_a_read_only_folder_is_refused_in_one_line(capsys, target, natives, earlier, tmp_path):
    locked, parent = tmp_path / "locked", tmp_path / "parent"
    locked.mkdir()
    parent.mkdir()
    before = _files(earlier)
    for folder in (locked, parent, earlier):
        folder.chmod(0o555)
    try:
        for out, extra in ((locked, ()), (parent / "new", ()), (earlier, ("--overwrite",))):
            code, _, line = _export(capsys, target, natives["eagle3"], "vllm", out, *extra)
            assert code == 2 and line.startswith(f"error: cannot write the export folder {out}: ") and \
                "not writable by this user" in line, line
    finally:
        for folder in (locked, parent, earlier):
            folder.chmod(0o755)
    assert _files(earlier) == before and _files(locked) == {} and not (parent / "new").exists()


def _check_whole(folder: Path, natives: dict, target) -> None:
    """`folder` is one export, all of a piece: its report, config, weights and checksums agree and it validates."""
    made = _provenance(folder)
    report = json.loads((folder / "export_report.json").read_text())
    assert (report["format"], report["method"]) == (made["format"], made["method"])
    assert sorted(p.name for p in folder.iterdir()) == ["README.md", "checksums.json", "config.json",
                                                       "export_report.json", "model.safetensors"]
    verify_weights(folder)
    validate_export(folder, made["format"], native_dir=natives[made["method"]], target=target,
                    prompts=default_prompts(target, count=1), k=2, max_new_tokens=4)


@pytest.mark.parametrize("overwrite", [False, True])
def test_two_exports_racing_into_one_folder_leave_one_whole_export(target, natives, tmp_path, overwrite):
    for trial in range(3):
        out = tmp_path / f"race{trial}"
        if overwrite:
            export_drafter(natives["eagle3"], "vllm", out, target=target, prompts=default_prompts(target, count=1),
                           k=2, max_new_tokens=4)
        results: dict[str, str] = {}

        def run(name, method, fmt):
            try:
                export_drafter(natives[method], fmt, out, target=target, prompts=default_prompts(target, count=1),
                               k=2, max_new_tokens=4, overwrite=overwrite)
                results[name] = "ok"
            except DraftsmithError as err:
                results[name] = str(err)

        threads = [threading.Thread(target=run, args=("a", "eagle3", "sglang")),
                   threading.Thread(target=run, args=("b", "eagle1", "vllm"))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert "ok" in results.values() and len(results) == 2, results
        for outcome in results.values():
            assert outcome == "ok" or ("\n" not in outcome and str(out) in outcome), outcome
        if not overwrite:
            assert list(results.values()).count("ok") == 1, results
        _check_whole(out, natives, target)
        assert _siblings(out) == []


def _dead_pid() -> int:
    """The pid of a process that has ended (a killed export's)."""
    return int(subprocess.run(["sh", "-c", "echo $$"], capture_output=True, text=True, check=True).stdout)


def test_what_a_killed_export_left_is_tidied_by_the_next(capsys, target, natives, earlier):
    pid = _dead_pid()
    before = _files(earlier)
    stale = earlier.with_name(f".{earlier.name}.tmp-{pid}-0badc0de")
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"half")
    # killed between moving the earlier export aside and renaming its own in: the earlier one goes back
    aside = earlier.with_name(f".{earlier.name}.old-{pid}-0123abcd")
    earlier.rename(aside)
    code, _, line = _export(capsys, target, natives["eagle1"], "vllm", earlier)
    assert code == 2 and "pass --overwrite to replace it" in line, line
    assert _files(earlier) == before and _siblings(earlier) == []
    live = earlier.with_name(f".{earlier.name}.tmp-{os.getpid()}-0badc0de")  # a run still going: left alone
    live.mkdir()
    assert _export(capsys, target, natives["eagle1"], "vllm", earlier, "--overwrite")[0] == 0
    assert _siblings(earlier) == [live.name]
    live.rmdir()


@pytest.mark.parametrize("checksums", [True, False])
def test_a_truncated_drafter_is_refused_naming_the_file(capsys, monkeypatch, target, natives, tmp_path, checksums):
    drafter = tmp_path / "drafter"
    shutil.copytree(natives["eagle3"], drafter)
    weights = drafter / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    if checksums:  # recorded sizes catch it before the target loads
        monkeypatch.setattr(draftsmith.serve.core.target, "load_configured",
                            lambda *a, **k: pytest.fail("the target loaded before the drafter was checked"))
    else:
        (drafter / "checksums.json").unlink()
    code, _, line = _export(capsys, target, drafter, "vllm", tmp_path / "out")
    assert code == 2 and line.startswith(f"error: {weights} ") and ("truncated" in line), line
    assert not (tmp_path / "out").exists() and _siblings(tmp_path / "out") == []


def test_target_overrides_reach_the_target(capsys, monkeypatch, target, natives, tmp_path):
    requested = []
    real = draftsmith.serve.core.threads.apply_threads
    monkeypatch.setattr(draftsmith.serve.core.threads, "apply_threads",
                        lambda threads=None, **kw: requested.append(threads) or real(threads, **kw))
    base = ["export", "--drafter", natives["eagle3"], "--format", "vllm", "--prompts", 1, "--max-new-tokens", 4]
    # the drafter's own target (no --target), then --target with the override, then the short spelling
    for i, extra in enumerate((["target.threads=1"], ["target.threads=1", "--target", target.path], ["threads=1"])):
        code, out, line = _run(capsys, *base, "--out", tmp_path / f"out{i}", *extra)
        assert code == 0, line
    assert requested == [1, 1, 1]


def test_replacing_where_the_system_cannot_swap_two_folders_in_one_step(monkeypatch, tmp_path):
    import draftsmith.serve.core.whole_folder as whole

    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("earlier")
    monkeypatch.setattr(whole, "_exchange", lambda a, b: False)
    with whole.whole_folder(out, replace=True) as folder:
        (folder / "new.txt").write_text("later")
    assert _files(out).keys() == {"new.txt"} and _siblings(out) == []

    real_rename, calls = os.rename, []

    def rename(src, dst):  # the new folder cannot be renamed in: the earlier one goes back
        calls.append(dst)
        if len(calls) == 3:
            raise OSError(errno.EIO, "Input/output error", str(dst))
        return real_rename(src, dst)

    monkeypatch.setattr(whole.os, "rename", rename)
    with pytest.raises(OSError, match="Input/output error"):
        with whole.whole_folder(out, replace=True) as folder:
            (folder / "third.txt").write_text("never")
    assert _files(out).keys() == {"new.txt"} and _siblings(out) == []
