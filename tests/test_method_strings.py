"""Outside the method folders (serve/methods/<name>/) and the registry, no module of the package branches on a
drafting method's name: no string comparison with one (`==`, `!=`, `in`, `startswith`), no table keyed by them
(two method names or more). Read
from the source, function bodies included; defaults, help texts and messages may still name them."""
from __future__ import annotations

import ast
from pathlib import Path

from draftsmith.serve.methods.registry import names

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ("serve", "data", "train", "eval", "scripts")
# runs in an engine's own environment, where draftsmith is not installed: it speaks the engines' names for methods
OUTSIDE = {"scripts/engine_worker.py"}


def _method_strings(node: ast.AST, methods: set[str]) -> list[str]:
    """The method names a constant, or a tuple / list / set of constants, holds."""
    if isinstance(node, ast.Constant) and node.value in methods:
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in methods]
    return []


def branches_on_methods(source: str, methods: set[str]) -> list[tuple[int, str]]:
    """(line, method name) of every comparison with, `startswith` of, or table keyed by a method's name."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            for side in [node.left, *node.comparators]:
                found += [(node.lineno, name) for name in _method_strings(side, methods)]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in (
                "startswith", "endswith"):
            for arg in node.args:
                prefixes = [arg] if isinstance(arg, ast.Constant) else list(getattr(arg, "elts", []))
                found += [(node.lineno, p.value) for p in prefixes if isinstance(p, ast.Constant)
                          and isinstance(p.value, str) and any(m.startswith(p.value) for m in methods)
                          and len(p.value) >= 4]
        elif isinstance(node, ast.Dict):  # a table over methods: two keys or more (one is a label, {"model": ...} JSON)
            keys = [k.value for k in node.keys if isinstance(k, ast.Constant) and k.value in methods]
            found += [(node.lineno, key) for key in keys] if len(keys) > 1 else []
    return found


def test_no_module_outside_the_method_folders_branches_on_a_method_name():
    methods = set(names())
    wrong = []
    for package in PACKAGE:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            if rel.startswith("serve/methods/") or rel in OUTSIDE:
                continue
            wrong += [f"{rel}:{line} {name!r}" for line, name in branches_on_methods(path.read_text(), methods)]
    assert wrong == []


def test_the_reader_finds_each_kind_of_branch():
    methods = {"eagle3", "medusa", "ngram"}
    source = '''
if config.method == "eagle3": pass
ok = kind in ("ngram", "other")
if name.startswith("eagle"): pass
TABLE = {"medusa": 1, "eagle3": 2}
label = "eagle3"  # a value, not a branch
specs = {"ngram": "ngram"}  # a label
'''
    assert branches_on_methods(source, methods) == [(2, "eagle3"), (3, "ngram"), (4, "eagle"), (5, "medusa"),
                                                    (5, "eagle3")]
