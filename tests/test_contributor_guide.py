"""docs/adding-a-method.md stays true: every field of the Method record is in its table and no other, every file it
names exists, and the folders it says to copy are registered methods."""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from draftsmith.serve.methods.registry import BUILTIN, Method, names

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "adding-a-method.md"


def test_the_guide_lists_every_field_of_the_method_record():
    table = [line for line in GUIDE.read_text().splitlines() if line.startswith("| `")]
    listed = {name for line in table for name in re.findall(r"`(\w+)`", line.split("|")[1])}
    fields = {f.name for f in dataclasses.fields(Method)}
    assert listed == fields, (sorted(fields - listed), sorted(listed - fields))  # none missing, none stale


def test_every_path_the_guide_names_exists():
    text = GUIDE.read_text()
    paths = set(re.findall(r"`((?:serve|train|data|eval|scripts|tests|docs)/[\w/.\-<>]+)`", text))
    missing = [p for p in sorted(paths) if "<" not in p and not (ROOT / p).exists()]
    assert paths and missing == []


def test_the_folders_to_copy_are_the_registered_methods():
    text = GUIDE.read_text()
    folders = set(re.findall(r"`serve/methods/(\w+)/`", text))
    assert folders and folders <= set(BUILTIN) <= set(names())
    assert all((ROOT / "serve" / "methods" / name / "__init__.py").is_file() for name in BUILTIN)
