"""One installed name, `draftsmith`: the repository's folders are its parts (pyproject.toml), and no code, test or
launcher names them by their folder (`serve`, `data`, `train`, `eval`, `scripts`, `configs`), which an installed
package does not have. tests/test_wheel.py builds and installs the wheel; this checks the sources, fast."""
from __future__ import annotations

import ast
import re
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10
    from pip._vendor import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"scripts": "draftsmith", "serve": "draftsmith.serve", "data": "draftsmith.data",
           "train": "draftsmith.train", "eval": "draftsmith.eval", "configs": "draftsmith.configs"}


def sources() -> list[Path]:
    return sorted(p for folder in (*FOLDERS, "tests") for p in (ROOT / folder).rglob("*.py")
                  if "__pycache__" not in p.parts)


def test_every_package_folder_is_installed_under_draftsmith():
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapped = {name: ROOT / folder for name, folder in setup["package-dir"].items()}
    assert {v.name: k for k, v in mapped.items()} == FOLDERS

    def folder_of(package: str) -> Path:
        parts = package.split(".")
        for n in range(len(parts), 0, -1):  # the longest mapped prefix, then plain subfolders
            if ".".join(parts[:n]) in mapped:
                return mapped[".".join(parts[:n])].joinpath(*parts[n:])
        raise AssertionError(f"{package} is not under a mapped folder")

    listed = {folder_of(p).resolve() for p in setup["packages"]}
    on_disk = {p.parent.resolve() for folder in FOLDERS for p in (ROOT / folder).rglob("__init__.py")
               if "__pycache__" not in p.parts}
    assert sorted(map(str, on_disk - listed)) == [], "package folders missing from pyproject.toml's packages"
    assert all(p.is_dir() for p in listed)
    assert setup["package-dir"]["draftsmith"] == "scripts" and (ROOT / "scripts" / "__main__.py").is_file()
    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"] == {
        "draftsmith": "draftsmith.cli:main"}


def test_no_code_imports_a_folder_by_its_own_name():
    old = set(FOLDERS)
    # a dotted module path of ours spelled from the folder, in a string: monkeypatch targets, `-m` arguments
    children = {top: {p.stem for p in (ROOT / top).iterdir() if p.suffix == ".py" or (p / "__init__.py").is_file()}
                for top in FOLDERS}
    spelled = re.compile(r"^(serve|train|eval|scripts|configs)\.(\w+)")  # data.x is also a config key
    wrong = []
    for path in sources():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                wrong += [f"{path.relative_to(ROOT)}:{node.lineno} import {a.name}" for a in node.names
                          if a.name.split(".")[0] in old]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module.split(".")[0] in old:
                wrong += [f"{path.relative_to(ROOT)}:{node.lineno} from {node.module}"]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                found = spelled.match(node.value)
                if found and found.group(2) in children[found.group(1)] and "=" not in node.value.split()[0]:
                    wrong += [f"{path.relative_to(ROOT)}:{node.lineno} {node.value[:60]!r}"]
    assert len(sources()) > 150 and wrong == []
    launchers = [p for p in [*(ROOT / "scripts").glob("*.sh"), ROOT / "Makefile"]
                 if re.search(r"-m (%s)\b" % "|".join(FOLDERS), p.read_text())]
    assert launchers == []
