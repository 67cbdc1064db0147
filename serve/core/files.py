"""Writing outputs so that a file that exists is whole: written under a temporary name beside it and renamed when
complete, the temporary removed on any failure (a full disk, Ctrl-C). And the two checks around that: an output
path that cannot be written is refused before the work starts, and a full disk is recognised in whatever form a
library reports it (Python's OSError, safetensors' "os error 28", torch's bare write failure)."""
from __future__ import annotations

import errno
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from draftsmith.serve.core.errors import DraftsmithError

__all__ = ["DiskFullError", "atomic_path", "check_output_path", "disk_full", "full_disk_error", "write_text_atomic"]

_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_FULL_TEXTS = ("No space left on device", "os error 28", "Disk quota exceeded", "os error 122")
_NEARLY_FULL = 1 << 20  # bytes: torch's writer reports a full disk only as a failed write


class DiskFullError(DraftsmithError):
    """The disk filled while writing an output; nothing partial of it was kept."""


def _existing(path: Path) -> Path:
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def disk_full(err: BaseException, where: str | Path) -> bool:
    """Whether `err`, raised while writing under `where`, came from a full disk (or quota)."""
    if isinstance(err, OSError) and err.errno in _FULL_ERRNOS:
        return True
    if any(text in str(err) for text in _FULL_TEXTS):
        return True
    try:
        return shutil.disk_usage(_existing(Path(where))).free < _NEARLY_FULL
    except OSError:
        return False


def full_disk_error(what: str, where: str | Path) -> DiskFullError:
    try:
        free_bytes = shutil.disk_usage(_existing(Path(where))).free
        free = (f"{free_bytes >> 10} KiB free now" if free_bytes < 1 << 30
                else f"{free_bytes / (1 << 30):.1f} GiB free now")
    except OSError:
        free = "free space unknown"
    return DiskFullError(f"the disk filled while writing {what}; nothing partial of it was kept ({free}): free "
                         f"space or write elsewhere, then run again")


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary path beside `path` to write to; renamed to `path` when the block ends, removed if it fails.
    A full disk becomes a DiskFullError naming `path`."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException as err:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)
        if isinstance(err, Exception) and not isinstance(err, DiskFullError) and disk_full(err, path.parent):
            raise full_disk_error(str(path), path.parent) from err
        raise


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write `text` to `path` whole or not at all, flushed to disk before the rename (the parent folder is
    created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
    return path


def check_output_path(path: str | Path, *, what: str = "output", folder: bool = False) -> Path:
    """DraftsmithError now, before any work, when `path` (a file, or with `folder` a folder) cannot be written:
    a part of it is a file where a folder must go, it is a folder where a file goes, or the nearest existing
    folder is read-only to us."""
    path = Path(path)
    if path.exists() and path.is_dir() != folder:
        kind = ("a file, not a folder", "a folder, not a file")[path.is_dir()]
        raise DraftsmithError(f"cannot write the {what} {path}: it is {kind}; choose another path")
    parent = _existing(path.parent)
    if not parent.is_dir():
        raise DraftsmithError(f"cannot write the {what} {path}: {parent} is a file, not a folder; choose another path")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise DraftsmithError(f"cannot write the {what} {path}: {parent} is not writable by this user; choose "
                              f"another path")
    return path
