"""A folder written whole or not at all: built in a temporary sibling (`.<name>.tmp-<pid>-<hex>`, same parent, so
the rename stays on one file system) and renamed into place once complete; on any failure the sibling is removed
and the destination is as it was.

An existing destination is kept unless the caller replaces it: the two folders are then swapped in one step where
the file system can (Linux `renameat2(RENAME_EXCHANGE)`), else the old one is moved aside and the new one renamed
in, and only then is the old one deleted. Siblings left by a run that was killed (their pid is gone) are removed by
the next run, and an old folder a killed run had moved aside goes back into place.
"""
from __future__ import annotations

import ctypes
import errno
import os
import re
import secrets
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.core.files import DiskFullError, disk_full, full_disk_error

__all__ = ["FolderTakenError", "clean_stale", "move_into_place", "whole_folder"]


class FolderTakenError(DraftsmithError):
    """Another run filled the destination while this one worked; this run's folder was removed."""


def _sibling(path: Path, kind: str) -> Path:
    """A new, empty folder (kind "tmp") or a free name (kind "old") beside `path`."""
    while True:
        candidate = path.with_name(f".{path.name}.{kind}-{os.getpid()}-{secrets.token_hex(4)}")
        if kind != "tmp":
            if not os.path.lexists(candidate):
                return candidate
            continue
        try:
            candidate.mkdir()  # 0o777 less the umask, as any folder the user makes
            return candidate
        except FileExistsError:
            continue


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def clean_stale(path: str | Path) -> None:
    """Remove the siblings of `path` that runs killed mid-way left behind; an old folder they had moved aside goes
    back to `path` if nothing took its place."""
    path = Path(path)
    pattern = re.compile(rf"\.{re.escape(path.name)}\.(tmp|old)-(\d+)-[0-9a-f]{{8}}")
    try:
        entries = list(path.parent.iterdir())
    except OSError:
        return
    for entry in entries:
        match = pattern.fullmatch(entry.name)
        if not match or _alive(int(match.group(2))):
            continue
        if match.group(1) == "old" and not os.path.lexists(path):
            try:
                os.rename(entry, path)
                continue
            except OSError:
                pass
        shutil.rmtree(entry, ignore_errors=True)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step (Linux renameat2 RENAME_EXCHANGE); False where the system cannot."""
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if renameat2 is None:
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def move_into_place(tmp: str | Path, path: str | Path, *, replace: bool) -> None:
    """Rename the finished folder `tmp` (made beside `path`) to `path`. A non-empty `path` is replaced only with
    `replace` (else FolderTakenError), swapped so that a whole folder is at `path` at every moment (one a killed
    run had moved aside goes back at the next clean_stale); the old folder is then removed."""
    tmp, path = Path(tmp), Path(path)
    try:
        os.rename(tmp, path)  # a missing or empty destination is taken in one step
        return
    except OSError as err:
        if err.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
    if not replace:
        raise FolderTakenError(f"{path} was filled by another run while this one worked; this run's output was not "
                               f"kept (see what it holds, then run again)")
    if _exchange(tmp, path):
        shutil.rmtree(tmp, ignore_errors=True)  # now the old folder
        return
    aside = _sibling(path, "old")
    os.rename(path, aside)
    try:
        os.rename(tmp, path)
    except BaseException:
        os.rename(aside, path)
        raise
    shutil.rmtree(aside, ignore_errors=True)


@contextmanager
def whole_folder(path: str | Path, *, replace: bool = False) -> Iterator[Path]:
    """An empty temporary folder beside `path` to write into; it becomes `path` when the block ends, and is removed
    if the block fails. A non-empty `path` is replaced only with `replace` (else FolderTakenError); a full disk
    becomes a DiskFullError naming `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    clean_stale(path)
    tmp = _sibling(path, "tmp")
    try:
        yield tmp
        move_into_place(tmp, path, replace=replace)
    except BaseException as err:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(err, DiskFullError) or (isinstance(err, Exception) and not isinstance(err, DraftsmithError)
                                               and disk_full(err, path.parent)):
            raise full_disk_error(str(path), path.parent) from err
        raise
