"""The contributor guides stay true: docs/adding-a-method.md lists every field of the Method record and no other,
docs/adding-a-family.md every field of the Family row; every file they name exists, and the folders the first says
to copy are registered methods."""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from draftsmith.serve.methods.registry import BUILTIN, Method, names

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "adding-a-method.md"
FAMILY_GUIDE = ROOT / "docs" / "adding-a-family.md"


def _first_column(guide: Path) -> set[str]:
    rows = [line for line in guide.read_text().splitlines() if line.startswith("| `")]
    return {name for line in rows for name in re.findall(r"`(\w+)`", line.split("|")[1])}


def test_the_guide_lists_every_field_of_the_method_record():
    listed = _first_column(GUIDE)
    fields = {f.name for f in dataclasses.fields(Method)}
    assert listed == fields, (sorted(fields - listed), sorted(listed - fields))  # none missing, none stale


def test_the_family_guide_lists_every_field_of_the_family_row():
    from draftsmith.serve.core.families import Family

    listed = _first_column(FAMILY_GUIDE)
    fields = {f.name for f in dataclasses.fields(Family)}
    assert listed == fields, (sorted(fields - listed), sorted(listed - fields))


def test_every_path_the_guides_name_exists():
    for guide in (GUIDE, FAMILY_GUIDE):
        paths = set(re.findall(r"`((?:serve|train|data|eval|scripts|tests|docs)/[\w/.\-<>]+)`", guide.read_text()))
        missing = [p for p in sorted(paths) if "<" not in p and not (ROOT / p).exists()]
        assert paths and missing == [], (guide.name, missing)


def test_the_folders_to_copy_are_the_registered_methods():
    text = GUIDE.read_text()
    folders = set(re.findall(r"`serve/methods/(\w+)/`", text))
    assert folders and folders <= set(BUILTIN) <= set(names())
    assert all((ROOT / "serve" / "methods" / name / "__init__.py").is_file() for name in BUILTIN)
