"""`draftsmith train`: recipes parse, unknown keys are errors listing the valid ones, a run ends in a drafter."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from draftsmith.cli import main
from draftsmith.serve.core.config import ConfigError, load_config
from tests.train_fixtures import EAGLE3_LAYERS, greedy_rows, save_rows, sharp_target
from draftsmith.train.config import TrainConfig, check

ROOT = Path(__file__).resolve().parents[1]
RECIPES = sorted([*(ROOT / "configs/smollm2-135m").glob("*.yaml"), *(ROOT / "configs/debug").glob("*.yaml")])


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.parent.name + "/" + p.name)
def test_recipes_are_valid_configs(recipe):
    config = check(load_config(TrainConfig, config_file=recipe))
    assert config.model.method in ("eagle1", "eagle3", "medusa")


def test_unknown_key_lists_the_valid_ones(capsys):
    with pytest.raises(ConfigError, match="valid keys here: .*lr"):
        load_config(TrainConfig, overrides=["optim.learning_rate=1"])
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "model.methd=eagle3"])
    assert exit_info.value.code == 2
    assert "valid keys here" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["train", "model.method=eagle9"])
    assert "eagle9" in capsys.readouterr().err


def test_train_command_writes_a_drafter_folder(tmp_path, capsys):
    target = sharp_target(tmp_path / "target", num_hidden_layers=EAGLE3_LAYERS)  # tiny.yaml trains EAGLE-3
    dataset = save_rows(greedy_rows(target, rows=6, new_tokens=12), tmp_path / "data")
    code = main(["train", "--config", str(ROOT / "configs/debug/tiny.yaml"), f"target={target}",
                 f"data.dataset={dataset}", f"out_dir={tmp_path / 'run'}", "data.eval_rows=2"])
    assert code == 0
    folder = Path(capsys.readouterr().out.strip().splitlines()[-1])
    assert folder == tmp_path / "run" / "drafter"
    assert json.loads((folder / "config.json").read_text())["method"] == "eagle3"
    assert (folder / "model.safetensors").is_file() and (folder / "config.resolved.yaml").is_file()
    records = [json.loads(line) for line in (tmp_path / "run" / "train_log.jsonl").read_text().splitlines()]
    steps = [r for r in records if "loss" in r]
    assert steps and all(k in steps[-1] for k in ("loss/ttt0", "lr", "tokens_per_s", "eta_seconds", "target_share"))
    assert list((tmp_path / "run" / "checkpoints").glob("step_*"))  # every: 3 of 6 steps


def test_wandb_runs_offline_without_a_key(tmp_path, monkeypatch):
    from draftsmith.train.tracking import Tracker, read_log

    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    tracker = Tracker(tmp_path, enabled=True, use_wandb=True, config={"a": 1}, total_steps=2, start_step=0,
                      progress=False, project="draftsmith-test", run_name="t")
    tracker.log({"loss": 1.5, "loss/ttt0": 1.5}, step=1)
    tracker.close()
    assert list((tmp_path / "wandb").glob("offline-run-*"))
    assert read_log(tmp_path)[0]["loss"] == 1.5
