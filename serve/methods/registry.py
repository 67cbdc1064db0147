"""The one registry of drafting methods: a method's folder (serve/methods/<name>/) says everything the project needs
of it in one `Method` record and registers it by name; training, data capture, the memory plan, the decoder, eval,
the server and every exporter ask here and never branch on a method's name (as torchtitan's train specs and
speculators' `register("medusa")`).

The project's own methods register when the registry is first read; a method of another distribution registers by
importing `register` (or through the entry-point group `draftsmith.methods`, whose modules are imported then too).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, Callable, Mapping, Optional

from draftsmith.serve.core.errors import DraftsmithError

BUILTIN = ("eagle1", "eagle3", "medusa")  # folders of serve/methods/, imported on the registry's first read
ENTRY_POINTS = "draftsmith.methods"       # the group another distribution's methods register under


class MethodError(DraftsmithError):
    """A method that is not registered, or a second registration of one name."""


def _no_check(config: Any) -> None:
    return None


@dataclass(frozen=True)
class Method:
    """Everything the project asks of one trained drafting method (a head distilled from the target's features).

    Each callable takes the project's objects as they are; the types in the comments are where they come from."""
    name: str                                  # HeadConfig.method, model.method, the folder's name
    title: str                                 # as messages and reports write it ("EAGLE-3")
    # (ModelConfig of train/config.py, Target) -> a fresh HeadConfig of this method for that target
    config: Callable[[Any, Any], Any]
    # HeadConfig -> an untrained head module (its state_dict is the drafter folder's model.safetensors)
    head: Callable[[Any], Any]
    # (head, target, *, check, policy, leaves) -> the Drafter the decoder drives (serve/drafters/base.py)
    drafter: Callable[..., Any]
    # (head, TargetParts, ObjectiveSettings) -> the Objective the training loop runs (serve/methods/objective.py)
    objective: Callable[[Any, Any, Any], Any]
    # the target's number of decoder layers -> the layer ids a capture stores for this method by default
    layers: Callable[[int], tuple[int, ...]]
    # (ModelConfig, HeadConfig) -> head forwards per training position (the memory plan's activation term)
    unroll: Callable[[Any, Any], int] = lambda model, cfg: 1
    # TrainConfig -> None or DraftsmithError naming the key: what this method asks of a recipe beyond the common checks
    check: Callable[[Any], None] = _no_check
    # its head holds one Llama decoder layer built from HeadConfig.layer_config (serve/drafters/draft_layer.py)
    llama_layer: bool = False
    # model.* keys only this method reads: set on a recipe of another method they are refused, not ignored
    options: tuple[str, ...] = ()
    # engine format name (serve/export/formats.py) -> its FormatExport (serve/export/method_export.py); a format
    # not named refuses the export with one line
    exports: Mapping[str, Any] = field(default_factory=dict)
    # HeadConfig -> the draft tokens per cycle an export's read-back is compared at (each a forward of the head)
    validation_k: Callable[[Any], int] = lambda cfg: min(cfg.num_speculative_tokens, 5)


_METHODS: dict[str, Method] = {}
_loaded = False


def register(method: Method) -> Method:
    """Add `method` under its name; MethodError when another method holds that name already."""
    _load()  # the project's own first: a name of theirs is taken whatever was imported first
    held = _METHODS.get(method.name)
    if held is not None and held is not method:
        raise MethodError(f"two drafting methods register the name {method.name!r} ({held.title} and "
                          f"{method.title}); registered: {', '.join(names())}")
    _METHODS[method.name] = method
    return method


def _load() -> None:
    """Import the project's method folders, then those of the `draftsmith.methods` entry points, once."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    for name in BUILTIN:
        importlib.import_module(f"draftsmith.serve.methods.{name}")
    for entry in entry_points(group=ENTRY_POINTS):
        entry.load()


def names() -> tuple[str, ...]:
    """The registered methods' names, sorted (whichever module imported a method folder first)."""
    _load()
    return tuple(sorted(_METHODS))


def find(name: str) -> Optional[Method]:
    _load()
    return _METHODS.get(name)


def method(name: str, *, what: str = "drafting method") -> Method:
    """The registered method `name`; MethodError naming the registered ones when there is none."""
    found = find(name)
    if found is None:
        raise MethodError(f"{what} {name!r} is not registered; registered: {', '.join(names())} (a method of another "
                          f"package registers when that package is imported or installed with a "
                          f"{ENTRY_POINTS!r} entry point)")
    return found


def unregister(name: str) -> None:
    """Remove `name` (a test's own method, when the test ends)."""
    _METHODS.pop(name, None)
