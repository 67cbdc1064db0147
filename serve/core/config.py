"""Typed configs, built one way by every command: dataclass defaults < YAML recipe < `a.b=value` overrides <
command-line flags, type-checked and validated when built.

    config = load_config(ServeConfig, config_file=args.config, section="serve", overrides=args.overrides,
                         flags={"k": args.k, "target.spec": args.target})

- the recipe is a file or a built-in recipe's name (`--config smollm2-135m/eagle3`, serve/core/recipes.py); it
  holds the command's `section` (`data:`, `capture:`, `eval:`, `serve:`, ...) or is its config as a whole;
  an override may carry the section's prefix (`data.batch_size=4`) or not; a prefix naming another section is
  an error;
- flags are dotted keys; the ones left unset (None) do not count;
- a schema may keep renamed keys working (`ALIASES = {"device": "target.device"}`) and refuse removed ones with
  where they went (`MOVED = {"old": "what to use instead"}`); unknown keys fail with the valid ones;
- every float must be finite and every setting a schema names in `RANGES` within its range (serve/core/ranges.py);
- the schema's `validate()` runs on the result (value checks a type cannot express).

OmegaConf structured configs do the merging and type checks; this module turns their errors into one
actionable line and writes the resolved config beside outputs.
"""
from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any, Mapping, Sequence, TypeVar

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError

from draftsmith.serve.core.errors import ConfigError
from draftsmith.serve.core.files import write_text_atomic
from draftsmith.serve.core.ranges import check_ranges
from draftsmith.serve.core.recipes import resolve_recipe

__all__ = ["ConfigError", "load_config", "save_config", "to_dict"]

T = TypeVar("T")


def _fields(schema: Any) -> dict[str, Any]:
    """name -> type of a dataclass's fields (resolved, so `from __future__ import annotations` is fine)."""
    if not dataclasses.is_dataclass(schema):
        return {}
    hints = typing.get_type_hints(schema)
    return {f.name: hints.get(f.name, f.type) for f in dataclasses.fields(schema)}


def _valid_keys(schema: type, dotted: str) -> list[str]:
    """Keys valid at the level of `dotted` (the parent of the offending key)."""
    node: Any = schema
    for part in dotted.split(".")[:-1]:
        fields = _fields(node)
        if part not in fields or not dataclasses.is_dataclass(fields[part]):
            break
        node = fields[part]
    return sorted(_fields(node))


def _canonical_key(schema: type, dotted: str, shown: str) -> str:
    """A dotted key with the schemas' renamed keys replaced by their new names; a removed key is an error."""
    node: Any = schema
    parts = dotted.split(".")
    out: list[str] = []
    i = 0
    while i < len(parts):
        part, fields = parts[i], _fields(node)
        moved = getattr(node, "MOVED", {})
        aliases = getattr(node, "ALIASES", {})
        if part in moved and part not in fields:
            raise ConfigError(f"config key {shown!r} is gone: {moved[part]}")
        if part in aliases and (part not in fields or i == len(parts) - 1):
            parts[i:i + 1] = aliases[part].split(".")
            continue
        out.append(part)
        node = fields.get(part)
        i += 1
    if dataclasses.is_dataclass(node):
        raise ConfigError(f"{shown!r} sets the section {'.'.join(out)!r} as a whole; set its keys instead: "
                          f"{', '.join(f'{out[-1]}.{k}' for k in _fields(node))}")
    return ".".join(out)


def _canonical_mapping(schema: Any, mapping: Any, where: str) -> Any:
    """A recipe mapping with renamed keys moved to their new places (nested sections too)."""
    if not isinstance(mapping, dict) or not dataclasses.is_dataclass(schema):
        return mapping
    fields = _fields(schema)
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        key = str(key)
        shown = f"{where}{key}"
        if key in getattr(schema, "MOVED", {}) and key not in fields:
            raise ConfigError(f"config key {shown!r} is gone: {schema.MOVED[key]}")
        if key in getattr(schema, "ALIASES", {}) and (key not in fields or not isinstance(value, dict)):
            path, value = schema.ALIASES[key], value
        else:
            path, value = key, _canonical_mapping(fields.get(key), value, f"{shown}.")
        node, parts = out, path.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        last = parts[-1]
        if last in node and not (isinstance(node[last], dict) and isinstance(value, dict)
                                 and not set(node[last]) & set(value)):
            raise ConfigError(f"config key {shown!r} and another one name the same setting ({where}{path}); "
                              f"keep one")
        node[last] = {**node[last], **value} if last in node else value
    return out


def _nested(dotted: Mapping[str, Any]) -> dict:
    out: dict[str, Any] = {}
    for key, value in dotted.items():
        node = out
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return out


def load_config(schema: type[T], *, config_file: str | Path | None = None, section: str | None = None,
                overrides: Sequence[str] = (), flags: Mapping[str, Any] | None = None) -> T:
    """Build `schema` from its defaults, the recipe (its `section` when it has one), the overrides, then the flags
    that were set (see the module docstring). Raises ConfigError naming the key (and the valid keys)."""
    base = OmegaConf.structured(schema)
    OmegaConf.set_struct(base, True)
    prefix = f"{section}." if section else ""
    layers = []
    if config_file is not None:
        path = resolve_recipe(config_file)  # a file, or a built-in recipe by name (`smollm2-135m/eagle3`)
        try:
            loaded = OmegaConf.to_container(OmegaConf.load(path))
        except (OmegaConfBaseException, yaml.YAMLError) as err:
            raise ConfigError(f"bad config file {path}: {' '.join(str(err).split())}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"config file {path} holds a {type(loaded).__name__}, not a mapping of settings "
                              f"(key: value lines, e.g. `{section or 'optim'}:` and its keys below it)")
        if section is not None and isinstance(loaded, dict) and section in loaded:
            loaded = loaded[section]
        else:
            prefix = ""
        layers.append(OmegaConf.create(_canonical_mapping(schema, loaded or {}, prefix)))
    dotlist = []
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key=value (e.g. train.lr=3e-4)")
        key, value = item.split("=", 1)
        if section is not None and key.startswith(f"{section}.") and section not in _fields(schema):
            key = key[len(section) + 1:]
        elif section is not None and "." in key and key.split(".")[0] not in _fields(schema) \
                and key.split(".")[0] not in getattr(schema, "ALIASES", {}):
            raise ConfigError(f"override {item!r} is not a `{section}.*` key (e.g. {section}.batch_size=4); "
                              f"this command reads only the `{section}` section")
        dotlist.append(f"{_canonical_key(schema, key, item)}={value}")
    if dotlist:
        layers.append(OmegaConf.from_dotlist(dotlist))
    given = {_canonical_key(schema, key, key): value for key, value in (flags or {}).items() if value is not None}
    if given:
        layers.append(OmegaConf.create(_nested(given)))
    try:
        merged = OmegaConf.merge(base, *layers)
        config = OmegaConf.to_object(merged)
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
    check_ranges(config, prefix=f"{section}." if section else "")
    if hasattr(config, "validate"):
        config.validate()
    return config  # type: ignore[return-value]


def to_dict(config: Any) -> dict:
    return OmegaConf.to_container(OmegaConf.structured(config), resolve=True)  # type: ignore[return-value]


def save_config(config: Any, out_dir: str | Path, name: str = "config.resolved.yaml") -> Path:
    """Write the resolved config beside an output, so every result says how it was made."""
    return write_text_atomic(Path(out_dir) / name, OmegaConf.to_yaml(OmegaConf.structured(config)))
