"""A finished drafter already in a run's out_dir (out_dir/drafter): the same run again (the same command, which
resumes from its last checkpoint) writes it anew; another run's config replaces it only with `overwrite`, and then
starts from step 0 (the earlier run's checkpoints are not resumed). A drafter folder that holds anything but a
drafter is never replaced. Checked before the target loads."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.core.whole_folder import clean_stale
from draftsmith.serve.drafters.folder import is_drafter_folder, read_config
from draftsmith.train.config import TrainConfig

DRAFTER_DIR = "drafter"
RESOLVED_NAME = "config.resolved.yaml"  # draftsmith.serve.core.config.save_config, written into the drafter folder
# How a run is watched, saved or spread over processes, not what it trains: runs that differ only here are one run.
_NOT_TRAINING = ("log", "tracking", "checkpoint", "distributed")
_NOT_TRAINING_TARGET = ("threads", "device")
# How long it trains: a finished run given more steps, epochs or seconds goes on from its last checkpoint (the
# same run, trained further), as the same command resumes an interrupted one.
_LENGTH = ("optim.epochs", "optim.max_steps", "optim.max_seconds")


@dataclass
class EarlierDrafter:
    description: str  # 'an eagle3 drafter (40 steps)'
    same_run: bool    # made by this config: replacing it changes nothing


def _trained(config: dict) -> dict:
    kept = {k: v for k, v in config.items() if k not in _NOT_TRAINING}
    if isinstance(kept.get("target"), dict):
        kept["target"] = {k: v for k, v in kept["target"].items() if k not in _NOT_TRAINING_TARGET}
    return kept


def _flat(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        out.update(_flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
    return out


def changed_settings(saved: Path, config: TrainConfig) -> list[str]:
    """The training settings of `config` that differ from the resolved config saved at `saved`."""
    old = _flat(_trained(OmegaConf.to_container(OmegaConf.load(saved), resolve=True)))
    new = _flat(_trained(OmegaConf.to_container(OmegaConf.create(OmegaConf.to_yaml(OmegaConf.structured(config))),
                                                resolve=True)))
    return sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k) and k not in _LENGTH)


def _describe(folder: Path) -> str:
    what = f"a {read_config(folder).method} drafter"
    try:
        steps = json.loads((folder / "training_summary.json").read_text())["steps"]
    except (OSError, ValueError, KeyError, TypeError):
        return what
    return f"{what} ({steps} steps)"


def check_earlier_drafter(config: TrainConfig, *, overwrite: bool = False) -> EarlierDrafter | None:
    """None when out_dir holds no finished drafter; else what it holds, when this run may replace it (the same
    run, or `overwrite`); else a DraftsmithError saying what is there and what to do."""
    folder = Path(config.out_dir) / DRAFTER_DIR
    clean_stale(folder)  # an earlier drafter a killed save had moved aside goes back
    if not folder.exists() or (folder.is_dir() and not any(folder.iterdir())):
        return None
    if not is_drafter_folder(folder):
        names = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
        raise DraftsmithError(f"{folder} holds {names or 'a file'}, not a drafter: move it away or choose another "
                              f"out_dir (nothing was written)")
    what = _describe(folder)
    changed = changed_settings(folder / RESOLVED_NAME, config) if (folder / RESOLVED_NAME).is_file() \
        else [f"its {RESOLVED_NAME} is missing"]
    if not changed:
        return EarlierDrafter(what, same_run=True)
    if not overwrite:
        shown = ", ".join(changed[:6]) + (f", ... {len(changed) - 6} more" if len(changed) > 6 else "")
        raise DraftsmithError(f"{config.out_dir} holds {what} finished by another run (changed: {shown}); pass "
                              f"--overwrite to replace it, or choose another out_dir (nothing was written)")
    return EarlierDrafter(what, same_run=False)
