"""What the command line prints when a command fails for a reason the user can act on: one line `error: ...` and
exit code 2 (scripts/cli/__init__.py). Ctrl-C prints one line and exits 130, the shell's code for SIGINT.

Our own errors are DraftsmithErrors (serve/core/errors.py) and say what to do; the file system's refusals (a full
disk, a file where a folder must go, no permission) arrive as OSErrors from wherever they happened and are
worded here.
"""
from __future__ import annotations

import errno

INTERRUPTED = ("interrupted: outputs are written whole or not at all; data build, data capture and train resume "
               "where they stopped when run again")

_OS_ERRORS = {
    errno.ENOSPC: "no space left on the device holding {path}: free space or write elsewhere, then run again",
    errno.EDQUOT: "disk quota exceeded writing {path}: free space or write elsewhere, then run again",
    errno.ENOTDIR: "{path}: a part of this path is a file, not a folder; choose another path",
    errno.EEXIST: "{path} already exists as a file where a folder must go; choose another path",
    errno.EISDIR: "{path} is a folder where a file must go; choose another path",
    errno.EACCES: "permission denied: {path}; choose a path this user can write",
    errno.EPERM: "operation not permitted: {path}; choose a path this user can write",
    errno.EROFS: "{path} is on a read-only file system; choose another path",
    errno.ENAMETOOLONG: "{path}: a file name is too long; choose a shorter path",
}


def one_line(err: BaseException) -> str:
    return " ".join(line.strip() for line in str(err).splitlines() if line.strip()) or type(err).__name__


def describe_os_error(err: OSError) -> str:
    """One actionable line for an OSError the file system raised."""
    path = err.filename if err.filename is not None else "an output"
    template = _OS_ERRORS.get(err.errno or 0)
    if template is None:
        return one_line(err)
    return template.format(path=path)
