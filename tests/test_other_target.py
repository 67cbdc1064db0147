"""Data, caches and drafters made for another target are refused with one line naming both targets, before any
weight is loaded and leaving no folder behind; `--allow-other-target` lets a fine-tune (same tokenizer and hidden
size) through, never another tokenizer or width."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from draftsmith.data.made_for import TargetRecord, check_made_for
from draftsmith.cli import main
from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.core.target import load_target
from tests.tiny_models import SPECIALS, tiny_tokenizer
from tests.train_fixtures import EAGLE3_LAYERS, greedy_rows, save_rows, sharp_target

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "configs/debug/tiny.yaml")


@pytest.fixture(scope="module")
def targets(tmp_path_factory) -> dict[str, Path]:
    """base; tuned: the same tokenizer and config, other weights (a fine-tune's stand-in); wide: the same tokenizer,
    another hidden size; retok: another tokenizer (one more special token)."""
    root = tmp_path_factory.mktemp("targets")
    made = {"base": sharp_target(root / "base", num_hidden_layers=EAGLE3_LAYERS, seed=0),
            "tuned": sharp_target(root / "tuned", num_hidden_layers=EAGLE3_LAYERS, seed=1),
            "wide": sharp_target(root / "wide", num_hidden_layers=EAGLE3_LAYERS, seed=2, hidden_size=48),
            "retok": sharp_target(root / "retok", num_hidden_layers=EAGLE3_LAYERS, seed=3, vocab_size=260)}
    tokenizer = tiny_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIALS + ["<|tool|>"]})
    tokenizer.save_pretrained(made["retok"])
    return made


def record(target_dir: Path) -> dict:
    return {**TargetRecord.of(load_target(target_dir, weights=False)).to_json(), "path": str(target_dir)}


@pytest.fixture(scope="module")
def dataset(targets, tmp_path_factory) -> Path:
    """Rows of the base target's greedy text, with the build_info.json `data build` writes."""
    folder = save_rows(greedy_rows(targets["base"], rows=6, new_tokens=12), tmp_path_factory.mktemp("ds") / "ds")
    (folder / "build_info.json").write_text(json.dumps({"target": record(targets["base"])}))
    return folder


def train(target: Path, dataset: Path, out: Path, *extra: str) -> int:
    flags = [e for e in extra if e.startswith("--")]  # argparse wants them before the key=value overrides
    return main(["train", "--config", TINY, *flags, f"target={target}", f"data.dataset={dataset}", f"out_dir={out}",
                 "data.eval_rows=2", "optim.max_steps=2", "checkpoint.every=0",
                 *[e for e in extra if not e.startswith("--")]])


def no_weights(monkeypatch):
    """Loading a target's weights fails the test: refusals must come first."""
    import draftsmith.serve.core.launch_target

    def refuse(*args, **kwargs):
        raise AssertionError("the target's weights were loaded before the refusal")

    monkeypatch.setattr(draftsmith.serve.core.launch_target, "load_launch_target", refuse)


def refused(capsys, code_or_call) -> str:
    """The one error line of a CLI run that exited 2."""
    with pytest.raises(SystemExit) as exit_info:
        code_or_call()
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: ") and "Traceback" not in "\n".join(err)
    return err[-1]


def test_records_of_one_model_agree_and_a_fine_tune_differs_in_weights(targets):
    base, tuned = TargetRecord.of(load_target(targets["base"])), TargetRecord.of(load_target(targets["tuned"],
                                                                                           weights=False))
    assert TargetRecord.of(load_target(targets["base"], weights=False)) == base  # no weights needed
    assert (base.tokenizer_hash, base.config_hash, base.hidden_size) == \
        (tuned.tokenizer_hash, tuned.config_hash, tuned.hidden_size)
    assert base.weights and tuned.weights and base.weights != tuned.weights
    with pytest.raises(DraftsmithError, match=r"built for target .*base.* \(weights sha .*\) but this run's target is "
                                              r".*tuned.*; REMAKE, or pass --allow-other-target"):
        check_made_for(base, tuned, what="ds was built", remake="REMAKE")
    assert "used anyway" in check_made_for(base, tuned, what="ds was built", remake="R", allow_other=True)
    assert check_made_for(base, base, what="ds was built", remake="R") is None
    older = TargetRecord(name="x", tokenizer_hash=base.tokenizer_hash, config_hash=base.config_hash)  # no weights
    assert check_made_for(older, tuned, what="ds was built", remake="R") is None


def test_a_dataset_of_another_model_is_refused_before_loading_it(targets, dataset, tmp_path, capsys, monkeypatch):
    no_weights(monkeypatch)
    out = tmp_path / "run"
    line = refused(capsys, lambda: train(targets["tuned"], dataset, out))
    assert f"{dataset} was built for target {str(targets['base'])!r}" in line
    assert f"this run's target is {str(targets['tuned'])!r}" in line
    assert "draftsmith data build --target" in line and "--allow-other-target" in line
    assert not out.exists()


def test_allow_other_target_trains_a_fine_tune_on_its_base_data(targets, dataset, tmp_path, capsys):
    out = tmp_path / "run"
    assert train(targets["tuned"], dataset, out, "--allow-other-target") == 0
    captured = capsys.readouterr()
    assert "used anyway (--allow-other-target" in captured.err
    assert (out / "drafter" / "model.safetensors").is_file()


@pytest.mark.parametrize("other, why", [("retok", "the tokenizers differ"), ("wide", "the hidden sizes differ")])
def test_another_tokenizer_or_width_is_refused_even_when_allowed(targets, dataset, tmp_path, capsys, monkeypatch,
                                                                  other, why):
    no_weights(monkeypatch)
    out = tmp_path / "run"
    line = refused(capsys, lambda: train(targets[other], dataset, out, "--allow-other-target",
                                         "model.draft_vocab_size=0"))
    assert str(targets["base"]) in line and str(targets[other]) in line and why in line
    assert not out.exists()


def test_ids_outside_the_vocabulary_are_refused_without_a_record(targets, tmp_path, capsys):
    rows = greedy_rows(targets["base"], rows=6, new_tokens=12)
    rows[0]["input_ids"][3] = 300  # tokenized for a bigger vocabulary; no build_info.json says so
    dataset = save_rows(rows, tmp_path / "ds")
    out = tmp_path / "run"
    line = refused(capsys, lambda: train(targets["base"], dataset, out))
    assert "holds token id 300 but the target's vocabulary has 259 ids" in line
    assert not out.exists()


def test_too_few_rows_leave_no_folder(targets, dataset, tmp_path, capsys):
    out = tmp_path / "nested" / "run"
    line = refused(capsys, lambda: train(targets["base"], dataset, out, "data.eval_rows=5"))
    assert "1 training rows are fewer than one global batch (2" in line
    assert not (tmp_path / "nested").exists()
    kept = tmp_path / "kept"
    (kept / "notes.txt").parent.mkdir()
    (kept / "notes.txt").write_text("mine")
    refused(capsys, lambda: train(targets["base"], dataset, kept, "data.eval_rows=5"))
    assert [p.name for p in kept.iterdir()] == ["notes.txt"]  # nothing of the user's removed, nothing added


@pytest.fixture(scope="module")
def cache(targets, dataset, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("cache") / "cache"
    assert main(["data", "capture", "--target", str(targets["base"]), "--dataset", str(dataset), "--out", str(out),
                 "--storage-dtype", "fp32", "--no-progress", "capture.target.device=cpu"]) == 0
    return out


def test_a_cache_of_another_model_is_refused_for_training(targets, cache, tmp_path, capsys, monkeypatch):
    no_weights(monkeypatch)
    out = tmp_path / "run"
    line = refused(capsys, lambda: main(["train", "--config", TINY, f"target={targets['tuned']}", "data.mode=offline",
                                         f"data.cache={cache}", f"out_dir={out}"]))
    assert f"the cache {cache} was captured for target {str(targets['base'])!r}" in line
    assert str(targets["tuned"]) in line and "draftsmith data capture --target" in line
    assert not out.exists()
    line = refused(capsys, lambda: main(["train", "--config", TINY, "--allow-other-target", f"target={targets['wide']}",
                                         "data.mode=offline", f"data.cache={cache}", f"out_dir={out}"]))
    assert "the hidden sizes differ" in line and not out.exists()
    monkeypatch.undo()
    assert main(["train", "--config", TINY, "--allow-other-target", f"target={targets['tuned']}", "data.mode=offline",
                 f"data.cache={cache}", f"out_dir={out}", "optim.max_steps=2", "checkpoint.every=0"]) == 0
    assert (out / "drafter" / "model.safetensors").is_file()


def test_capture_refuses_another_models_dataset_and_cache(targets, dataset, cache, tmp_path, capsys, monkeypatch):
    no_weights(monkeypatch)
    before = sorted(p.name for p in cache.iterdir())

    def capture(target: str, out: Path, *flags: str):
        return lambda: main(["data", "capture", "--target", str(targets[target]), "--dataset", str(dataset),
                             "--out", str(out), "--storage-dtype", "fp32", "--no-progress", *flags,
                             "capture.target.device=cpu"])

    line = refused(capsys, capture("tuned", tmp_path / "new"))
    assert f"{dataset} was built for target {str(targets['base'])!r}" in line and "--allow-other-target" in line
    assert not (tmp_path / "new").exists()
    # allowed to read the base's dataset, a fine-tune still cannot add its states to the base's cache
    line = refused(capsys, capture("tuned", cache, "--allow-other-target"))
    assert f"{cache} holds a capture (see manifest.json) made for target {str(targets['base'])!r}" in line
    assert f"this run's target is {str(targets['tuned'])!r}" in line and "cannot mix two targets" in line
    line = refused(capsys, capture("retok", tmp_path / "new", "--allow-other-target"))
    assert "the tokenizers differ" in line and not (tmp_path / "new").exists()
    assert sorted(p.name for p in cache.iterdir()) == before


def test_a_drafter_for_another_target_names_both(targets, dataset, tmp_path, capsys):
    out = tmp_path / "run"
    assert train(targets["base"], dataset, out) == 0
    capsys.readouterr()
    line = refused(capsys, lambda: main(["generate", "--target", str(targets["wide"]), "--drafter",
                                         str(out / "drafter"), "--prompt", "hi", "--max-new-tokens", "2", "--quiet"]))
    assert f"trained for target {str(targets['base'])!r}" in line and f"used with {str(targets['wide'])!r}" in line
