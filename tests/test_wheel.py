"""The installed package is whole: the sdist is built from the sources, the wheel from the sdist (as
`python -m build` does), and the wheel installed into a fresh virtual environment outside the checkout runs
`draftsmith --help`, a built-in recipe's `train --print-config` and the quick demo (on a tiny target) from an empty
folder. The environment reuses the installed torch and the rest (a .pth naming this interpreter's site-packages),
never the checkout nor its editable install."""
from __future__ import annotations

import email
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

from tests.tiny_models import save_tiny_target

ROOT = Path(__file__).resolve().parents[1]
# What the sdist is made from (pyproject.toml, MANIFEST.in); runs/, .venv/ and the build's own leftovers stay behind.
SOURCES = ["pyproject.toml", "MANIFEST.in", "README.md", "LICENSE", "Makefile", "serve", "data", "train", "eval",
           "scripts", "configs", "tests", "docs"]
# the repository's folders and the names they are installed under: one top-level name, `draftsmith`
INSTALLED = {"scripts": "draftsmith", "serve": "draftsmith/serve", "data": "draftsmith/data",
             "train": "draftsmith/train", "eval": "draftsmith/eval", "configs": "draftsmith/configs"}


def installed_as(path: str) -> str:
    """Where the repository file `path` (e.g. configs/demo/quick.yaml) lands in the wheel."""
    top, _, rest = path.partition("/")
    return f"{INSTALLED[top]}/{rest}"


def _build(tmp: Path) -> tuple[Path, Path]:
    """(sdist, wheel): the PEP 517 hooks of setuptools (the build backend the project names), no build isolation."""
    src = tmp / "src"
    src.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(ROOT / name, src / name)

    def hook(call: str, cwd: Path) -> str:
        code = f"import sys; from setuptools import build_meta as b; print(b.{call}(sys.argv[1]))"
        proc = subprocess.run([sys.executable, "-c", code, str(tmp / "dist")], cwd=cwd, capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc.stdout.strip().splitlines()[-1]

    sdist = tmp / "dist" / hook("build_sdist", src)
    with tarfile.open(sdist) as archive:
        safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}  # Python >= 3.10.12 / 3.11.4
        archive.extractall(tmp / "unpacked", **safe)
    wheel = tmp / "dist" / hook("build_wheel", tmp / "unpacked" / sdist.name.removesuffix(".tar.gz"))
    return sdist, wheel


def _venv(tmp: Path, wheel: Path) -> Path:
    """A fresh venv with the wheel installed; this interpreter's site-packages (torch, transformers, ...) appended
    to its path by a .pth, whose lines add folders without running that folder's own .pth files (so the
    checkout's editable-install finder never loads)."""
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    ours = dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
    (site / "zz_reuse_installed.pth").write_text("".join(f"{path}\n" for path in ours))
    proc = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index",
                           "--no-compile", "--disable-pip-version-check", "-q", str(wheel)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return venv


@pytest.mark.slow
def test_the_wheel_installed_outside_the_checkout_runs_the_cli(tmp_path):
    start = time.perf_counter()
    sdist, wheel = _build(tmp_path)
    names = zipfile.ZipFile(wheel).namelist()
    top = sorted({name.split("/")[0] for name in names})
    info = f"draftsmith-{wheel.name.split('-')[1]}.dist-info"
    assert top == sorted(["draftsmith", info]), top  # one package: no serve/, data/, ..., tests/, runs/, docs/
    shipped = set(names)
    modules = [p.relative_to(ROOT).as_posix() for folder in INSTALLED for p in (ROOT / folder).rglob("*.py")
               if "__pycache__" not in p.parts]
    assert len(modules) > 100 and [f for f in modules if installed_as(f) not in shipped] == []  # every module
    configs = [p.relative_to(ROOT).as_posix() for p in (ROOT / "configs").rglob("*")
               if p.is_file() and "__pycache__" not in p.parts]
    # every recipe and template, llama-3.1-8b/ included
    assert [f for f in configs if installed_as(f) not in shipped] == []
    prompts = [p.relative_to(ROOT).as_posix() for p in (ROOT / "data" / "builtin").glob("*.jsonl")]
    assert prompts and [f for f in prompts if installed_as(f) not in shipped] == []
    assert {"draftsmith/launch_multi_gpu.sh", "draftsmith/launch_multi_node.sh"} <= shipped
    assert not [n for n in names if "/tests/" in n or n.startswith(("tests/", "runs/")) or "__pycache__" in n]
    meta = email.message_from_bytes(zipfile.ZipFile(wheel).read(f"{info}/METADATA"))
    assert meta["License-Expression"] == "Apache-2.0" and meta["Description-Content-Type"] == "text/markdown"
    assert {"serve", "deepspeed", "dev"} <= set(meta.get_all("Provides-Extra"))
    assert meta.get_payload().lstrip().startswith("# draftsmith") and meta.get_all("Classifier")
    assert f"{info}/licenses/LICENSE" in shipped
    assert "draftsmith = draftsmith.cli:main" in zipfile.ZipFile(wheel).read(
        f"{info}/entry_points.txt").decode()
    with tarfile.open(sdist) as archive:
        in_sdist = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    assert {"tests/conftest.py", "tests/tiny_models.py", "LICENSE", "configs/llama-3.1-8b/eagle3.yaml"} <= in_sdist

    venv = _venv(tmp_path, wheel)
    work = tmp_path / "empty"
    work.mkdir()
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(OMP_NUM_THREADS="1", WANDB_MODE="offline", HF_HUB_OFFLINE="1", PYTHONNOUSERSITE="1")

    def run(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
        return subprocess.run([str(venv / "bin" / args[0]), *args[1:]], cwd=work, env=env, capture_output=True,
                              text=True, timeout=timeout)

    where = run("python", "-c", "import sys, draftsmith, draftsmith.configs, draftsmith.data, draftsmith.eval, "
                "draftsmith.serve, draftsmith.train; print('\\n'.join(sys.modules[m].__file__ "
                "for m in sys.modules if m.startswith('draftsmith'))); "
                "print(any('__editable__' in name for name in sys.modules))")
    assert where.returncode == 0, where.stderr
    *files, editable = where.stdout.split()
    site = (venv / "lib").resolve()
    assert len(files) >= 6 and all(Path(f).resolve().is_relative_to(site) for f in files), files  # the wheel's
    assert editable == "False"
    for old in ("serve", "data", "train", "eval", "scripts", "configs"):  # the folders' own names are not installed
        gone = run("python", "-c", f"import {old}")
        assert gone.returncode != 0 and "ModuleNotFoundError" in gone.stderr, (old, gone.stdout, gone.stderr[-500:])
    as_module = run("python", "-m", "draftsmith", "--help")
    assert as_module.returncode == 0 and "demo" in as_module.stdout, as_module.stderr[-2000:]

    help_ = run("draftsmith", "--help")
    assert help_.returncode == 0 and "demo" in help_.stdout, help_.stderr[-2000:]
    printed = run("draftsmith", "train", "--config", "smollm2-135m/eagle3", "--print-config")
    assert printed.returncode == 0 and "spec: demo" in printed.stdout, printed.stderr[-2000:]
    wrong = run("draftsmith", "train", "--config", "smollm2-135m/eagle4", "--print-config")
    assert wrong.returncode == 2 and "built-in recipes: " in wrong.stderr and "demo/quick" in wrong.stderr

    # the demo's own recipe (demo/quick) and built-in prompts from the installed package, on a tiny target: every
    # stage runs (data, capture, train, eval, exports with their READMEs, generate) in seconds
    target = save_tiny_target(tmp_path / "tiny", num_hidden_layers=4)  # EAGLE-3 reads 3 layers below the last
    demo = run("draftsmith", "demo", "--quick", "--budget", "off", "--threads", "1", "--out", "demo",
               f"target.spec={target}", "eagle3.model.draft_vocab_size=128", "medusa.model.draft_vocab_size=128")
    assert demo.returncode == 0, demo.stderr[-3000:]
    assert (work / "demo" / "report" / "result.json").is_file()
    assert (work / "demo" / "exports" / "eagle3-vllm" / "README.md").is_file()
    assert "mu per domain" in demo.stdout
    print(f"wheel {wheel.stat().st_size / 1e3:.0f} kB ({', '.join(top)}), sdist {sdist.stat().st_size / 1e3:.0f} kB;"
          f" built, installed and run in {time.perf_counter() - start:.0f} s")
