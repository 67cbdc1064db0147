"""The target is a typed object: every parameter named `target` in the package is annotated with the loaded target's
class (serve/core/target.py `Target`, alone or beside the spec strings a few entry points also take), and the name
resolves to that class. A recipe's `target` section is a TargetConfig, a spec is `target_spec`, a loss's reference
tensor is not a target. Read from the source; `scripts/engine_worker.py` runs without draftsmith (its targets are
an engine's objects)."""
from __future__ import annotations

import ast
import importlib
import re
from dataclasses import replace
from pathlib import Path

from draftsmith.serve.core.target import Target, load_target
from draftsmith.train.config import TrainConfig
from draftsmith.train.heads import head_config

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ("serve", "data", "train", "eval", "scripts")
OUTSIDE = {"scripts/engine_worker.py"}


def untyped_targets(source: str) -> list[tuple[int, str, str]]:
    """(line, function, annotation or '-') of every parameter named `target` whose annotation does not name Target."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        args = node.args
        for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
            if arg.arg != "target":
                continue
            names = {n.id for n in ast.walk(arg.annotation) if isinstance(n, ast.Name)} if arg.annotation else set()
            if "Target" not in names:
                found.append((node.lineno, getattr(node, "name", "lambda"),
                              ast.unparse(arg.annotation) if arg.annotation else "-"))
    return found


def package_files() -> list[Path]:
    return [p for folder in PACKAGE for p in sorted((ROOT / folder).rglob("*.py"))
            if str(p.relative_to(ROOT)) not in OUTSIDE]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    parts = ["draftsmith", *(parts[1:] if parts[0] == "scripts" else parts)]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_the_reader_finds_an_untyped_target():
    source = ("def a(target): ...\n"
              "def b(x, *, target: Any = None): ...\n"
              "def c(target: Target | None = None): ...\n"
              "def d(target: 'str'): ...\n")
    assert [(line, name) for line, name, _ in untyped_targets(source)] == [(1, "a"), (2, "b"), (4, "d")]


def test_every_parameter_named_target_is_a_target():
    offenders = [f"{path.relative_to(ROOT)}:{line} {name}(target: {ann})"
                 for path in package_files() for line, name, ann in untyped_targets(path.read_text())]
    assert offenders == []


def imports_target(source: str) -> bool:
    """The module imports Target from serve/core/target.py (at its top, or under TYPE_CHECKING where the module
    keeps torch out of its import)."""
    return any(isinstance(node, ast.ImportFrom) and node.module == "draftsmith.serve.core.target"
               and any(alias.name == "Target" and alias.asname is None for alias in node.names)
               for node in ast.walk(ast.parse(source)))


def test_the_annotation_is_the_loaded_targets_class():
    """Every module that annotates a parameter `target: Target` imports that Target from serve/core/target.py, and
    the name the modules that import it at run time hold is that class."""
    annotating = [p for p in package_files() if re.search(r"\btarget: Target\b", p.read_text())]
    assert len(annotating) > 40  # the library, the evaluation, the benchmarks and the demo
    assert [str(p.relative_to(ROOT)) for p in annotating if not imports_target(p.read_text())] == []
    held = [importlib.import_module(_module_name(p)) for p in annotating if p.name != "__main__.py"]
    assert all(getattr(module, "Target", Target) is Target for module in held)


def test_a_target_known_by_its_config_gives_the_loaded_targets_head(tiny_target_factory):
    """`train --plan` sizes the head on Target.of_config (no weights, no tokenizer): the same head config as the
    loaded target's (EAGLE-3, the default: its aux layers read the layer count), but for the tokenizer hash."""
    folder = tiny_target_factory("llama", num_hidden_layers=4)
    loaded = load_target(folder, weights=False)
    config = TrainConfig()
    config.target.spec = str(folder)
    planned = head_config(config, Target.of_config(loaded.config, name=loaded.name))
    trained = head_config(config, loaded)
    assert planned.target_tokenizer_hash == "" and trained.target_tokenizer_hash == loaded.tokenizer_hash != ""
    assert replace(planned, target_tokenizer_hash=trained.target_tokenizer_hash) == trained
