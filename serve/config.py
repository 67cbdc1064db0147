"""Typed configs: dataclass defaults < YAML recipe < `a.b=value` overrides, checked when built.

OmegaConf structured configs do the merging and type checks; this module only turns their
errors into one actionable line and writes the resolved config beside outputs.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Sequence, TypeVar

from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError

from serve.errors import ConfigError

__all__ = ["ConfigError", "load_config", "save_config", "to_dict"]

T = TypeVar("T")


def _valid_keys(schema: type, dotted: str) -> list[str]:
    """Keys valid at the level of `dotted` (the parent of the offending key)."""
    node: Any = schema
    parts = dotted.split(".")[:-1]
    for part in parts:
        fields = {f.name: f for f in dataclasses.fields(node)} if dataclasses.is_dataclass(node) else {}
        if part not in fields:
            break
        node = fields[part].type if isinstance(fields[part].type, type) else _resolve(node, part)
    if not dataclasses.is_dataclass(node):
        return []
    return sorted(f.name for f in dataclasses.fields(node))


def _resolve(owner: type, name: str) -> Any:
    import typing

    return typing.get_type_hints(owner)[name]


def load_config(schema: type[T], *, config_file: str | Path | None = None,
                overrides: Sequence[str] = (), section: str | None = None) -> T:
    """Build `schema` from its defaults, then `config_file` (optionally only its `section`), then overrides.

    Unknown keys and values of the wrong type raise ConfigError naming the key and the valid keys.
    """
    base = OmegaConf.structured(schema)
    OmegaConf.set_struct(base, True)
    layers = []
    if config_file is not None:
        path = Path(config_file)
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}")
        loaded = OmegaConf.load(path)
        if section is not None:
            loaded = loaded.get(section, OmegaConf.create({}))
        layers.append(loaded)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key=value (e.g. train.lr=3e-4)")
    if overrides:
        layers.append(OmegaConf.from_dotlist(list(overrides)))
    try:
        merged = OmegaConf.merge(base, *layers)
        return OmegaConf.to_object(merged)  # type: ignore[return-value]
    except ConfigKeyError as err:
        key = str(getattr(err, "full_key", "") or "")
        valid = _valid_keys(schema, key) if key else []
        raise ConfigError(f"unknown config key {key!r} for {schema.__name__}; valid keys here: "
                          f"{', '.join(valid)}") from None
    except ValidationError as err:
        key = str(getattr(err, "full_key", "") or "?")
        raise ConfigError(f"bad value for config key {key!r}: {err.msg.splitlines()[0]}") from None
    except OmegaConfBaseException as err:
        raise ConfigError(f"bad config: {str(err).splitlines()[0]}") from None


def to_dict(config: Any) -> dict:
    return OmegaConf.to_container(OmegaConf.structured(config), resolve=True)  # type: ignore[return-value]


def save_config(config: Any, out_dir: str | Path, name: str = "config.resolved.yaml") -> Path:
    """Write the resolved config beside an output, so every result says how it was made."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / name
    path.write_text(OmegaConf.to_yaml(OmegaConf.structured(config)))
    return path
