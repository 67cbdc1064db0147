"""Where an export may go: a new or empty folder, or, with `overwrite`, a folder that holds an earlier export and
nothing else. Checked before any work; the folder itself is only ever replaced whole (serve/core/whole_folder.py),
so a refused or failed export leaves it as it was."""
from __future__ import annotations

import json
import os
from pathlib import Path

from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.core.whole_folder import clean_stale
from draftsmith.serve.drafters.folder import CHECKSUMS_NAME
from draftsmith.serve.export.common import CONFIG_NAME, PROVENANCE_KEY, WEIGHTS_NAME

README_NAME = "README.md"
REPORT_NAME = "export_report.json"
EXPORT_FILES = (CONFIG_NAME, WEIGHTS_NAME, CHECKSUMS_NAME, README_NAME, REPORT_NAME)


def describe_export(folder: str | Path) -> str | None:
    """'a vllm export of eagle3 (drafter D, target T)' for a folder draftsmith exported; None for anything else."""
    try:
        entry = json.loads((Path(folder) / CONFIG_NAME).read_text()).get(PROVENANCE_KEY)
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(entry, dict) or "format" not in entry or "method" not in entry:
        return None
    source = ", ".join(f"{label} {entry[key]}" for label, key in (("drafter", "native_drafter"),
                                                                   ("target", "target_name")) if entry.get(key))
    return f"a {entry['format']} export of {entry['method']}" + (f" ({source})" if source else "")


def _shown(names: list[str]) -> str:
    return str(names[:8])[:-1] + (f", ... {len(names) - 8} more]" if len(names) > 8 else "]")


def check_destination(out_dir: str | Path, *, overwrite: bool = False) -> str | None:
    """None when `out_dir` is missing or empty; with `overwrite`, the description of the earlier export it holds
    (which the export will replace); else DraftsmithError saying what the folder holds and what to do. What a
    killed export left beside it is tidied first (an earlier export it had moved aside goes back)."""
    out = Path(out_dir)
    clean_stale(out)
    if not out.exists():
        return None
    if not out.is_dir():
        raise DraftsmithError(f"cannot write the export folder {out}: it is a file, not a folder; choose another path")
    if not os.access(out, os.W_OK | os.X_OK):
        raise DraftsmithError(f"cannot write the export folder {out}: it is not writable by this user; choose "
                              f"another path")
    names = sorted(p.name for p in out.iterdir())
    if not names:
        return None
    what = describe_export(out)
    others = [name for name in names if name not in EXPORT_FILES]
    if what is None:
        raise DraftsmithError(f"{out} already holds {_shown(names)}, not a draftsmith export: export into a new or "
                              f"empty folder (nothing was written)")
    if others:
        raise DraftsmithError(f"{out} holds {what} and also {_shown(others)}: move those away or export into a new "
                              f"or empty folder (--overwrite replaces a folder that holds an export and nothing "
                              f"else; nothing was written)")
    if not overwrite:
        raise DraftsmithError(f"{out} holds {what}; pass --overwrite to replace it (nothing was written)")
    return what
