"""The `data build` out folder, replaced whole: the dataset is saved into a temporary sibling that takes over
everything else the folder holds (the .work resume point, any file of the user's: hard links, so nothing is copied
twice) and is then swapped into place (serve/core/whole_folder.py). A kill or a full disk mid-save leaves the
earlier dataset, whole; the folder never lacks one once it had one.

What may be replaced: a dataset whose rows the folder's .work keeps (a rerun rebuilds it from them); a dataset
without them (another tool's, or one whose .work was deleted) only with `overwrite`, since its rows would be lost."""
from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.core.whole_folder import clean_stale

WORK = ".work"
# What a build writes at the top of its folder (datasets' save_to_disk, then build_info.json and the config)
BUILD_FILES = ("dataset_info.json", "state.json", "build_info.json", "config.resolved.yaml")


def is_build_file(name: str) -> bool:
    return name in BUILD_FILES or (name.startswith("data-") and name.endswith(".arrow"))


def check_out(out: Path, *, overwrite: bool = False) -> str | None:
    """Before any work: None when `out` is new, empty or a build's own folder (its .work keeps the rows); with
    `overwrite`, a description of the dataset it holds without them (which the build replaces); else a
    DraftsmithError saying what is there and what to do. What a killed build left beside it is tidied first."""
    clean_stale(out)
    if not out.is_dir() or (out / WORK / "state.json").is_file():
        return None
    names = sorted(p.name for p in out.iterdir())
    if not any(is_build_file(name) for name in names):
        return None  # empty, or only the user's own files: they are kept
    files = [name for name in names if is_build_file(name)]
    shown = ", ".join(files[:4]) + (f", ... {len(files) - 4} more" if len(files) > 4 else "")
    what = f"a dataset ({shown}) whose rows no {WORK} folder keeps"
    if not overwrite:
        raise DraftsmithError(f"{out} holds {what}: pass --overwrite to replace it, or choose another --out "
                              f"(nothing was written)")
    return what


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)  # the rows are written whole and never changed in place (write_text_atomic)
    except OSError as err:
        if err.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
            raise
        shutil.copy2(src, dst)


def carry_over(old: Path, new: Path) -> None:
    """Everything in `old` but a dataset into `new` (the .work resume point, the user's files)."""
    if not old.is_dir():
        return
    for entry in old.iterdir():
        if is_build_file(entry.name):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.copytree(entry, new / entry.name, symlinks=True, copy_function=_link_or_copy)
        elif entry.is_symlink():
            os.symlink(os.readlink(entry), new / entry.name)
        else:
            _link_or_copy(str(entry), str(new / entry.name))
