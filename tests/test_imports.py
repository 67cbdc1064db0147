"""The import layering the restructurings settled, read from the source:
the decoder sees drafters only through their protocol, no drafter imports the decoder, and the packages point one
way (DESIGN.md: serve <- data <- train, serve <- eval, which reads prompts through data; scripts on top), and
only train/loop.py touches accelerate, DeepSpeed or torch.distributed. Function-level imports count too."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# what the decoders may take from serve/drafters/: the protocol, the K / tree settings, the length model's maths (the
# batch's draft width) and the pause rule (the batch's drafting gate), never a drafter
DECODER_MAY_IMPORT = {"draftsmith.serve.drafters.base", "draftsmith.serve.drafters.settings",
                      "draftsmith.serve.drafters.length_model",
                      "draftsmith.serve.drafters.pause"}
# package -> packages it must never import
NEVER = {"serve": {"data", "train", "eval", "scripts"}, "data": {"train", "eval", "scripts"},
         "train": {"eval", "scripts"}, "eval": {"train", "scripts"}}
DISTRIBUTED = ("accelerate", "deepspeed", "torch.distributed")


def folder_of(module: str) -> str | None:
    """The repository folder an import of ours comes from (`draftsmith.serve.x` -> serve, `draftsmith.cli` ->
    scripts, the package itself); None for another distribution's module."""
    parts = module.split(".")
    if parts[0] != "draftsmith":
        return None
    return parts[1] if len(parts) > 1 and parts[1] in ("serve", "data", "train", "eval", "configs") else "scripts"


def imports_of(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_the_decoder_imports_no_drafter():
    for path in [ROOT / "serve" / "decoding.py", *sorted((ROOT / "serve" / "batch").glob("*.py"))]:  # batch 1, batched
        from_drafters = {m for m in imports_of(path) if m.startswith(("draftsmith.serve.drafters",
                                                                      "draftsmith.serve.methods"))}
        assert from_drafters <= DECODER_MAY_IMPORT, (path.name, sorted(from_drafters - DECODER_MAY_IMPORT))


def test_no_drafter_imports_the_decoder():
    """Drafters and method folders' modules never import the decoder; the builders in `__init__.py` may (the oracle's
    answer key is what plain decoding outputs)."""
    paths = [*(ROOT / "serve" / "drafters").glob("*.py"), *(ROOT / "serve" / "methods").rglob("*.py")]
    offenders = [str(p.relative_to(ROOT)) for p in sorted(paths)
                 if p.name != "__init__.py" and "draftsmith.serve.decoding" in imports_of(p)]
    assert offenders == []


def test_packages_point_one_way():
    wrong = []
    for package, forbidden in NEVER.items():
        for path in sorted((ROOT / package).rglob("*.py")):
            bad = {m for m in imports_of(path) if folder_of(m) in forbidden}
            wrong += [f"{path.relative_to(ROOT)} imports {m}" for m in sorted(bad)]
    assert wrong == []


def test_only_the_training_loop_touches_the_distributed_stack():
    touching = [p.name for p in sorted((ROOT / "train").glob("*.py"))
                if any(m == d or m.startswith(d + ".") for m in imports_of(p) for d in DISTRIBUTED)]
    assert touching == ["loop.py"]


def _module_name(path: Path) -> str:
    """The installed name of the repository file `path` (scripts/cli/train.py -> draftsmith.cli.train)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    parts = ["draftsmith", *(parts[1:] if parts[0] == "scripts" else parts)]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """module -> the project modules it imports (function-level imports too; `from pkg import mod` names mod)."""
    paths = [p for package in ("serve", "data", "train", "eval", "scripts") for p in sorted((ROOT / package).rglob("*.py"))]
    modules = {_module_name(p): p for p in paths}
    graph = {}
    for name, path in modules.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                edges.update(alias.name for alias in node.names if alias.name in modules)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module in modules:
                subs = {f"{node.module}.{alias.name}" for alias in node.names} & set(modules)
                edges.update(subs or {node.module})
        graph[name] = edges - {name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circles():
    """No module reaches itself through imports, function-level ones included: every layer reads on its own."""
    assert circles(import_graph()) == []


def test_the_core_stands_on_nothing_else():
    """serve/core is what every package imports (target loading, configs, errors, files, threads, costs, the layer
    convention, prompts, sampling): it imports nothing of draftsmith outside itself."""
    wrong = []
    for path in sorted((ROOT / "serve" / "core").glob("*.py")):
        ours = {m for m in imports_of(path) if folder_of(m) is not None}
        wrong += [f"{path.name} imports {m}" for m in sorted(ours) if not m.startswith("draftsmith.serve.core")]
    assert wrong == []


def test_cli_and_benchmarks_live_apart():
    """The command line is scripts/cli/ (one module per subcommand); benchmarks and simulations are scripts/bench/;
    nothing of the package imports a benchmark."""
    top = sorted(p.name for p in (ROOT / "scripts").glob("*.py"))
    assert not [name for name in top if name.startswith(("cmd_", "bench_"))], top
    importers = [str(p.relative_to(ROOT)) for package in ("serve", "data", "train", "eval", "scripts/cli")
                 for p in sorted((ROOT / package).rglob("*.py")) if any(m.startswith("draftsmith.bench")
                                                                        for m in imports_of(p))]
    assert importers == []


def test_data_train_and_eval_take_shared_concepts_from_the_core():
    """data/, train/ and eval/ take what every package shares from serve/core; of the rest of serve/ only the
    drafters and the methods' registry and folders (which training trains and evaluation measures) and the decoders,
    batch 1 and batched (which evaluation measures and self-distillation generates with)."""
    allowed = ("draftsmith.serve.core", "draftsmith.serve.drafters", "draftsmith.serve.methods",
               "draftsmith.serve.decoding", "draftsmith.serve.batch")
    wrong = []
    for package in ("data", "train", "eval"):
        for path in sorted((ROOT / package).rglob("*.py")):
            wrong += [f"{path.relative_to(ROOT)} imports {m}" for m in sorted(imports_of(path))
                      if folder_of(m) == "serve" and not m.startswith(allowed)]
    assert wrong == []
