"""`--config`: a recipe file the user names by its path, or a built-in recipe by its name.

The built-in recipes are the YAML files of the `configs` package (the repository's configs/ folder, shipped as
package data in the wheel), named by their path below it without `.yaml`: `smollm2-135m/eagle3`, `demo/quick`.
A name may carry `.yaml` and the `configs/` prefix the docs use, so `--config configs/smollm2-135m/eagle3.yaml`
works from any folder once draftsmith is installed. A file the user's path names comes first.

    resolve_recipe("smollm2-135m/eagle3")   # -> .../configs/smollm2-135m/eagle3.yaml
"""
from __future__ import annotations

from importlib import resources
from pathlib import Path, PurePosixPath

from draftsmith.serve.core.errors import ConfigError

__all__ = ["builtin_dir", "builtin_recipes", "resolve_recipe"]

# Folders of configs/ that hold other tools' files, not recipes of ours: `accelerate launch --config_file`'s
# templates and scripts/bench/ablate.py's plans. They ship all the same; they are not `--config` names.
NOT_RECIPES = ("accelerate", "ablations")
SUFFIXES = (".yaml", ".yml")


def builtin_dir() -> Path:
    """The folder of the built-in recipes and templates (configs/ in a checkout, site-packages/draftsmith/configs installed)."""
    try:
        return Path(str(resources.files("draftsmith.configs")))
    except ModuleNotFoundError:  # an editable install made before configs/ became package data
        raise ConfigError("the built-in recipes (package `draftsmith.configs`) are not installed: reinstall draftsmith "
                          "(`make env` in a checkout, or pip install again)") from None


def builtin_recipes() -> list[str]:
    """Names of the built-in recipes, e.g. `demo/quick`, `smollm2-135m/eagle3`."""
    root = builtin_dir()
    names = (path.relative_to(root) for path in root.rglob("*.yaml"))
    return sorted(name.with_suffix("").as_posix() for name in names if name.parts[0] not in NOT_RECIPES)


def _as_name(spec: str) -> str | None:
    """The built-in name `spec` would be (`configs/` and `.yaml` dropped), or None when it is a path no name has:
    absolute, `~` or `.`-led, or with another suffix."""
    name = PurePosixPath(spec.replace("\\", "/"))
    if name.is_absolute() or spec.startswith(("~", ".")) or ".." in name.parts:
        return None
    if name.suffix in SUFFIXES:
        name = name.with_suffix("")
    elif name.suffix:
        return None
    if name.parts[:1] == ("configs",) and len(name.parts) > 1:
        name = PurePosixPath(*name.parts[1:])
    return name.as_posix()


def resolve_recipe(spec: str | Path) -> Path:
    """The recipe file `spec` names: an existing file, else the built-in recipe of that name. ConfigError (one line:
    what was looked for and the built-in names) when it is neither."""
    path = Path(spec).expanduser()
    if path.is_file():
        return path
    if path.is_dir():
        raise ConfigError(f"--config {spec}: a folder, not a recipe file; name a .yaml file in it or a built-in "
                          f"recipe ({', '.join(builtin_recipes())})")
    name = _as_name(str(spec))
    if name is None:
        raise ConfigError(f"config file not found: {spec} (no such file, and no built-in recipe is named so: those "
                          f"are named like smollm2-135m/eagle3)")
    recipes = builtin_recipes()
    if name in recipes:
        return builtin_dir() / f"{name}.yaml"
    raise ConfigError(f"config file not found: {spec} is neither a file nor a built-in recipe; built-in recipes: "
                      f"{', '.join(recipes)}")
