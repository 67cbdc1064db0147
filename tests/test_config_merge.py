"""One way for every command to build its config: defaults < recipe (section or whole file) < key=value < flags;
one TargetConfig embedded everywhere; earlier spellings keep working; unknown keys and bad values fail when built."""
from __future__ import annotations

import json

import pytest

from draftsmith.data.config import CaptureConfig, DataBuildConfig
from draftsmith.eval.config import EvalConfig
from draftsmith.cli import main
from draftsmith.cli.generate import GenerateConfig
from draftsmith.serve.core.config import load_config
from draftsmith.serve.core.errors import ConfigError, DraftsmithError
from draftsmith.serve.server.config import ServeConfig
from draftsmith.serve.core.target_config import TargetConfig
from draftsmith.train.config import TrainConfig


@pytest.mark.parametrize("schema", [ServeConfig, EvalConfig, GenerateConfig, DataBuildConfig, CaptureConfig,
                                    TrainConfig])
def test_every_command_embeds_the_target_section(schema):
    overrides = ["target=some/model", "device=cpu"] + (["data.dataset=x"] if schema is TrainConfig else []) + \
        (["prompt=hi"] if schema is GenerateConfig else [])
    config = load_config(schema, overrides=overrides)  # the flat spellings of earlier versions
    assert isinstance(config.target, TargetConfig)
    assert (config.target.spec, config.target.device) == ("some/model", "cpu")
    config = load_config(schema, overrides=[o.replace("target=", "target.spec=").replace("device=", "target.device=")
                                            for o in overrides])
    assert (config.target.spec, config.target.device) == ("some/model", "cpu")


def test_layers_and_flags(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("serve:\n  target: from-yaml\n  k: 2\n  port: 9000\n  dtype: bf16\n")
    config = load_config(ServeConfig, config_file=recipe, section="serve", overrides=["k=3"],
                         flags={"port": None, "drafter": "ngram:max_n=2", "target.threads": 1})
    assert (config.target.spec, config.target.dtype, config.target.threads) == ("from-yaml", "bf16", 1)
    assert (config.k, config.port, config.drafter) == (3, 9000, "ngram:max_n=2")  # an unset flag does not count
    flat = tmp_path / "flat.yaml"
    flat.write_text("k: 4\ntarget:\n  spec: whole-file\n")  # a file without the section is the config itself
    config = load_config(ServeConfig, config_file=flat, section="serve", flags={"k": 6})
    assert (config.target.spec, config.k) == ("whole-file", 6)
    both = tmp_path / "both.yaml"
    both.write_text("dtype: bf16\ntarget:\n  dtype: fp16\n")
    with pytest.raises(ConfigError, match="name the same setting"):
        load_config(EvalConfig, config_file=both)


def test_renamed_keys_and_clashes():
    capture = load_config(CaptureConfig, section="capture",
                          overrides=["capture.dtype=fp16", "target_dtype=bf16", "capture.device=cpu"])
    # `dtype` is the storage dtype of a capture; its target's compute dtype lives in target.dtype like everywhere
    assert (capture.storage_dtype, capture.target.dtype, capture.target.device) == ("fp16", "bf16", "cpu")
    assert load_config(EvalConfig, overrides=["limit=2"]).per_domain_limit == 2  # per domain, unlike data's limit
    with pytest.raises(ConfigError, match="valid keys here: .*device.*dtype.*spec.*threads"):
        load_config(ServeConfig, overrides=["target.gpu=1"])
    with pytest.raises(ConfigError, match="not a `data.\\*` key"):
        load_config(DataBuildConfig, section="data", overrides=["capture.layers=eagle1"])


def test_configs_are_validated_when_built():
    with pytest.raises(DraftsmithError, match="k must be at least 1"):
        load_config(ServeConfig, overrides=["k=0"])
    with pytest.raises(DraftsmithError, match=r"target.device='gpu'"):
        load_config(EvalConfig, overrides=["device=gpu"])
    with pytest.raises(DraftsmithError, match="unknown sweep axis"):
        load_config(EvalConfig, overrides=["sweep=[kk=1]"])
    with pytest.raises(DraftsmithError, match="training runs the target in distributed.precision"):
        load_config(TrainConfig, overrides=["data.dataset=x", "target.dtype=bf16"])
    with pytest.raises(DraftsmithError, match="generate needs a prompt"):
        load_config(GenerateConfig)


def test_generate_and_fetch_demo_read_their_config(tmp_path, tiny_target_dir, capsys):
    recipe = tmp_path / "g.yaml"
    recipe.write_text(f"generate:\n  target: {tiny_target_dir}\n  prompt: abcabc\n  max_new_tokens: 6\n  k: 2\n")
    out = tmp_path / "g.json"
    assert main(["generate", "--config", str(recipe), "--quiet", "--json", str(out), "temperature=0.5", "seed=1"]) == 0
    settings = json.loads(out.read_text())["settings"]
    assert (settings["k"], settings["max_new_tokens"], settings["temperature"]) == (2, 6, 0.5)
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["target", "fetch-demo", "model=no-such-model"])
    assert capsys.readouterr().err == "error: model='no-such-model': choose one of gemma3-270m, smollm2-135m\n"
