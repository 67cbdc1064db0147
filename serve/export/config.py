"""`draftsmith export` options as a typed config: defaults < YAML (`--config`) < `key=value` < command-line flags."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar
from pathlib import Path

from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.core.ranges import check_ranges
from draftsmith.serve.core.target_config import TargetConfig

FORMAT_NAMES = ("vllm", "sglang", "speculators")


@dataclass
class ExportConfig:
    # `target=T` / `--target` set target.spec, `dtype=` the dtype of the validation runs (draftsmith.serve.core.config)
    ALIASES: ClassVar[dict[str, str]] = {"target": "target.spec", "dtype": "target.dtype", "device": "target.device",
                                         "threads": "target.threads"}
    RANGES: ClassVar[dict[str, str]] = {"prompts": ">= 1", "max_new_tokens": ">= 2", "k": ">= 0"}
    drafter: str = ""            # native drafter folder (`draftsmith train` output: RUN/drafter)
    format: str = "vllm"         # vllm | sglang | speculators
    out: str = ""                # folder to write: new or empty, or holding an earlier export with `overwrite`
    overwrite: bool = False      # replace the earlier export `out` holds (never other files)
    # spec "" = the target the drafter was trained with (its config.resolved.yaml)
    target: TargetConfig = field(default_factory=lambda: TargetConfig(spec=""))
    verifier: str = ""           # speculators: the verifier name_or_path vLLM loads; "" = the target's local folder
    engine_version: str = ""     # the engine release to serve with (e.g. 0.33.0); refused if it cannot load the export
    prompts: int = 3             # validation prompts (built-in, chat-formatted when the target has a template)
    max_new_tokens: int = 32     # tokens generated per validation prompt
    k: int = 0                   # draft tokens per cycle in validation; 0 = the drafter's K (at most 5)


def check(config: ExportConfig) -> ExportConfig:
    for key in ("drafter", "out"):
        if not getattr(config, key):
            raise DraftsmithError(f"export needs --{key} (or {key}=... in the config)")
    if config.format not in FORMAT_NAMES:
        raise DraftsmithError(f"format={config.format!r} is not one of {', '.join(FORMAT_NAMES)}")
    if not Path(config.drafter).is_dir():
        raise DraftsmithError(f"drafter folder not found: {config.drafter}")
    if config.engine_version:
        from draftsmith.serve.export.engines import parse_version

        parse_version(config.engine_version)
    check_ranges(config)
    config.target.validate()
    return config


def trained_target(drafter_dir: str | Path) -> str:
    """The target spec the drafter was trained with: `target` in its config.resolved.yaml, else its target name."""
    from omegaconf import OmegaConf

    from draftsmith.serve.drafters.folder import read_config

    resolved = Path(drafter_dir) / "config.resolved.yaml"
    if resolved.is_file():
        spec = OmegaConf.load(resolved).get("target")
        if isinstance(spec, Mapping):  # the `target:` section of a TrainConfig (earlier: the spec string)
            spec = spec.get("spec")
        if spec:
            return str(spec)
    name = read_config(drafter_dir).target_name
    if not name:
        raise DraftsmithError(f"{drafter_dir} does not say which target it was trained for; pass --target")
    return name
