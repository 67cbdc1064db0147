"""What one drafting method exports to one engine format: its folder's export.py makes a `FormatExport` per format it
has a form in and lists them in its Method record (`exports`); the formats (serve/export/formats.py) ask here and
never branch on a method's name."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.methods.registry import method, names
from draftsmith.serve.core.target import Target


def _nothing(*args: Any, **kwargs: Any) -> list:
    return []


def _no_package_check(out, target: Target, head, *, where: str) -> str:
    return ""  # the engine cannot be imported beside draftsmith; scripts/check_engines.py runs its loader


@dataclass(frozen=True)
class FormatExport:
    """One method's form in one engine format, stage by stage (the formats module's docstring names the stages)."""
    architectures: tuple[str, ...]    # the engine's class names its folders carry (what the reader recognizes)
    serve_as: str                     # the engine's name for the method (vLLM's `method`, SGLang's algorithm)
    check: Callable                   # (HeadConfig) -> None: refuse a drafter no release can load, before writing
    support: Callable                 # (HeadConfig) -> engines.Support: the releases that load it
    build: Callable                   # (state, HeadConfig, TargetFacts) -> (config.json body, tensors)
    expected: Callable                # (HeadConfig, TargetFacts) -> FormatSpec: what the engine reads, from its source
    claims: Callable                  # (config.json dict) -> bool: the engine folder holds this method's head
    read: Callable                    # (config.json, tensors, *, num_layers, where) -> (HeadConfig, state)
    # the capability the target's class must have to host it (serve/export/hosts.py Hosts fields); None: any
    hosted_as: Optional[str] = None
    full_vocab_only: bool = False     # the engine loads it with the target's whole vocabulary only
    notes: Callable = _nothing        # (HeadConfig, TargetFacts) -> [line]: version notes for OUT/README.md
    check_extra: Callable = _nothing  # (config.json dict) -> [problem]: what a FormatSpec cannot express
    package_check: Callable = _no_package_check  # (out, target, head, *, where) -> str: the engine's own package
    serve_options: Mapping[str, Any] = field(default_factory=dict)  # the speculative config's other keys


def method_export(method_name: str, fmt: str, engine: str) -> FormatExport:
    """The FormatExport of `method_name` in `fmt`; one line naming the formats it has when it has none there."""
    found = method(method_name, what="drafter method", trained=True)
    form = found.exports.get(fmt)
    if form is None and found.unexported:
        raise DraftsmithError(f"--format {fmt} cannot export method {method_name!r}: {found.unexported}")
    if form is None:
        others = sorted(found.exports)
        fix = (f"use --format {' or '.join(others)}" if others else
               "it has no engine format: serve it with `draftsmith serve`")
        raise DraftsmithError(f"--format {fmt} cannot export method {method_name!r}: {engine}'s {fmt} format has no "
                              f"{found.title} drafter; {fix}")
    return form


def format_exports(fmt: str) -> list[FormatExport]:
    """Every registered method's form in `fmt` (the reader tries them in turn)."""
    return [method(name).exports[fmt] for name in names() if fmt in method(name).exports]
