"""Every numeric setting of every command is range-checked when its config is built (serve/core/ranges.py), and a recipe
file that is not YAML, or not a mapping, is a one-line error."""
from __future__ import annotations

import dataclasses
import typing

import pytest

from draftsmith.data.config import CaptureConfig, DataBuildConfig
from draftsmith.eval.config import EvalConfig
from draftsmith.cli import main
from draftsmith.cli.fetch_demo import FetchDemoConfig
from draftsmith.cli.generate import GenerateConfig
from draftsmith.demo.run import DemoConfig
from draftsmith.serve.core.config import load_config
from draftsmith.serve.core.errors import ConfigError
from draftsmith.serve.export.config import ExportConfig
from draftsmith.serve.core.ranges import check_ranges, parse_range
from draftsmith.serve.server.config import ServeConfig
from draftsmith.train.config import TrainConfig

COMMAND_CONFIGS = [TrainConfig, DataBuildConfig, CaptureConfig, EvalConfig, GenerateConfig, ServeConfig, ExportConfig,
                   DemoConfig, FetchDemoConfig]


def _numeric(annotation) -> bool:
    args = [a for a in typing.get_args(annotation) if a is not type(None)]  # Optional[int], list[int]
    return annotation in (int, float) or any(_numeric(a) for a in args)


def _schemas(schema, seen):
    if schema in seen:
        return
    seen.add(schema)
    for name, annotation in typing.get_type_hints(schema).items():
        if dataclasses.is_dataclass(annotation):
            _schemas(annotation, seen)


@pytest.mark.parametrize("schema", COMMAND_CONFIGS, ids=lambda s: s.__name__)
def test_every_numeric_setting_has_a_range(schema):
    seen: set = set()
    _schemas(schema, seen)
    for section in seen:
        hints = typing.get_type_hints(section)
        numeric = {f.name for f in dataclasses.fields(section) if _numeric(hints[f.name])}
        ranges = set(getattr(section, "RANGES", {}))
        assert numeric <= ranges, f"{section.__name__}: no range for {sorted(numeric - ranges)}"
        assert ranges <= numeric, f"{section.__name__}: RANGES names {sorted(ranges - numeric)}, not numeric fields"
        for rule in getattr(section, "RANGES", {}).values():
            parse_range(rule)


def test_ranges():
    assert 0.5 in parse_range("(0, 1]") and 1 in parse_range("(0, 1]") and 0 not in parse_range("(0, 1]")
    assert 0 in parse_range("[0, 1)") and 1 not in parse_range("[0, 1)")
    assert 0 in parse_range(">= 0") and -1 not in parse_range(">= 0") and 0 not in parse_range("> 0")
    assert float("nan") not in parse_range("> 0") and 2 not in parse_range("<= 1") and 1 not in parse_range("< 1")
    assert parse_range("(0, 1]").describe() == "in (0, 1]" and parse_range(">= 1").describe() == "at least 1"
    with pytest.raises(ValueError):
        parse_range("positive")


@pytest.mark.parametrize("override, message", [
    ("optim.max_steps=-3", "optim.max_steps must be at least 0, got -3"),
    ("optim.lr=nan", "optim.lr must be a finite number, got nan"),
    ("optim.lr=-1", "optim.lr must be at least 0, got -1.0"),
    ("optim.beta2=1.0", r"optim.beta2 must be in \[0, 1\), got 1.0"),
    ("loss.decay=0", r"loss.decay must be in \(0, 1\], got 0.0"),
    ("target.threads=0", "target.threads must be at least 1, got 0"),
    ("checkpoint.keep=0", "checkpoint.keep must be at least 1, got 0"),
    ("optim.epochs=0", "optim.epochs must be at least 1, got 0"),
])
def test_train_settings_out_of_range(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(TrainConfig, overrides=["data.dataset=x", override])


def test_other_commands_and_configs_built_in_code():
    with pytest.raises(ConfigError, match=r"data.top_p must be in \(0, 1\], got 1.5"):
        load_config(DataBuildConfig, section="data", overrides=["data.top_p=1.5"])
    with pytest.raises(ConfigError, match="data.server.timeout must be a finite number, got inf"):
        load_config(DataBuildConfig, section="data", overrides=["data.server.timeout=inf"])
    with pytest.raises(ConfigError, match="capture.disk_headroom_gib must be at least 0"):
        load_config(CaptureConfig, section="capture", overrides=["disk_headroom_gib=-1"])
    with pytest.raises(ConfigError, match="eval.cost_ks must be at least 1, got 0"):
        load_config(EvalConfig, section="eval", overrides=["cost_ks=[1,0]"])
    with pytest.raises(ConfigError, match="eagle3.optim.lr must be a finite number"):
        load_config(DemoConfig, overrides=["eagle3.optim.lr=inf"])
    config = TrainConfig()
    config.optim.warmup_steps = -1  # built in code (the demo's way): train's check() refuses it too
    with pytest.raises(ConfigError, match="optim.warmup_steps must be at least 0"):
        check_ranges(config)
    with pytest.raises(ConfigError, match="temperature must be at least 0"):
        EvalConfig(temperature=-0.1).validate()


def test_cli_one_line_errors_for_bad_numbers_and_bad_recipes(tmp_path, capsys):
    def error_of(*argv):
        with pytest.raises(SystemExit) as exit_info:
            main(list(argv))
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1, err
        return err

    assert "optim.max_steps must be at least 0, got -3" in error_of("train", "data.dataset=x", "optim.max_steps=-3")
    assert "loss.kind='kl' is not one of ce, tv, nla, lk_hybrid" in error_of("train", "data.dataset=x", "loss.kind=kl")
    assert "loss.lk_eta must be at least 0" in error_of("train", "data.dataset=x", "loss.lk_eta=-1")
    assert "loss.kind=tv needs soft targets (EAGLE-1/3): Medusa" in error_of(
        "train", "data.dataset=x", "model.method=medusa", "loss.kind=tv")
    assert "loss.position_weighting='pace' is not one of decay, dpace" in error_of(
        "train", "data.dataset=x", "loss.position_weighting=pace")
    assert "loss.dpace_smoothing must be in [0, 1], got 2.0" in error_of("train", "data.dataset=x", "loss.dpace_smoothing=2")
    for method in ("eagle1", "medusa", "peagle"):
        assert "loss.position_weighting=dpace: " in error_of("train", "data.dataset=x", f"model.method={method}",
                                                              "loss.position_weighting=dpace")
    bad = tmp_path / "bad.yaml"
    bad.write_text("optim:\n  lr: [1\n")
    assert f"bad config file {bad}: while parsing a flow sequence" in error_of("train", "--config", str(bad))
    listed = tmp_path / "list.yaml"
    listed.write_text("- optim.lr=1\n- optim.epochs=2\n")
    assert "holds a list, not a mapping of settings" in error_of("train", "--config", str(listed))
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("just words\n")
    assert "unknown config key 'just words'" in error_of("eval", "--config", str(scalar))  # OmegaConf: a key
