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

# the folders of serve/methods/, imported on the registry's first read
BUILTIN = ("eagle1", "eagle3", "medusa", "dflash", "peagle", "mtp", "ngram", "hybrid", "oracle", "model",
           "gemma4_assistant")
ENTRY_POINTS = "draftsmith.methods"  # the group another distribution's methods register under


class MethodError(DraftsmithError):
    """A method that is not registered, or a second registration of one name."""


def _no_check(config: Any) -> None:
    return None


@dataclass(frozen=True)
class Method:
    """Everything the project asks of one drafting method. A trained method (a head distilled from the target's
    features: EAGLE-1, EAGLE-3, Medusa) fills the first group and is loaded from its drafter folder; a drafter that
    trains nothing (n-gram, hybrid, oracle, a draft model) fills `parse` and `build` and is named by its spec string.

    Each callable takes the project's objects as they are; the comments say where their types come from."""
    name: str                                  # HeadConfig.method / model.method / the spec's first word
    title: str                                 # as messages and reports write it ("EAGLE-3")
    # --- a trained head
    # (ModelConfig of train/config.py, Target) -> a fresh HeadConfig of this method for that target
    config: Optional[Callable[[Any, Any], Any]] = None
    # HeadConfig -> an untrained head module (its state_dict is the drafter folder's model.safetensors)
    head: Optional[Callable[[Any], Any]] = None
    # (head, target, *, check, policy, leaves) -> the Drafter the decoder drives (serve/drafters/base.py)
    drafter: Optional[Callable[..., Any]] = None
    # (head, TargetParts, ObjectiveSettings) -> the Objective the training loop runs (serve/methods/objective.py)
    objective: Optional[Callable[[Any, Any, Any], Any]] = None
    # the target's number of decoder layers -> the layer ids a capture stores for this method by default
    layers: Optional[Callable[[int], tuple[int, ...]]] = None
    # (ModelConfig, HeadConfig, row length) -> head forwards per training position (the memory plan's activations)
    unroll: Callable[[Any, Any, int], float] = lambda model, cfg, length: 1
    # TrainConfig -> None or DraftsmithError naming the key: what this method asks of a recipe beyond the common checks
    check: Callable[[Any], None] = _no_check
    # its head holds one Llama decoder layer built from HeadConfig.layer_config (serve/drafters/draft_layer.py)
    llama_layer: bool = False
    # its head drafts over a vocabulary of its own, which model.draft_vocab_size may reduce (else the target's)
    own_vocab: bool = False
    # the `loss.position_weighting` values its objective can weigh drafted positions by (loss_kinds.POSITION_WEIGHTINGS)
    position_weightings: tuple[str, ...] = ("decay",)
    # model.* keys only this method reads: set on a recipe of another method they are refused, not ignored
    options: tuple[str, ...] = ()
    # engine format name (serve/export/formats.py) -> its FormatExport (serve/export/method_export.py); a format
    # not named refuses the export with one line
    exports: Mapping[str, Any] = field(default_factory=dict)
    # what the refusal of a format it lacks says instead of "the engine has none" (the engine serves the method and
    # draftsmith does not write its format yet)
    unexported: str = ""
    # the method whose head and engine folders this one extends (P-EAGLE: EAGLE-3's, plus its mask slots): the
    # per-family checks of that method (scripts/support_matrix.py) cover its layer and the engines' target classes
    variant_of: str = ""
    # HeadConfig -> the draft tokens per cycle an export's read-back is compared at (each a forward of the head)
    validation_k: Callable[[Any], int] = lambda cfg: min(cfg.num_speculative_tokens, 5)
    # --- a drafter named by its spec string (serve/drafters/spec.py)
    # (the text after `name:`, the spec's common fields) -> DrafterSpec, or None when the text is not this method's
    parse: Optional[Callable[[str, dict], Any]] = None
    # (DrafterSpec, target, options) -> the Drafter
    build: Optional[Callable[[Any, Any, dict], Any]] = None
    usage: str = ""                            # how its spec is written, for the message naming every drafter
    # (the text after `name:`) -> the drafter's default label in an evaluation; None: the spec itself
    label: Optional[Callable[[str], str]] = None
    # --- what the decoder, eval and the hybrid ask of it
    trees: bool = False       # it drafts trees (`@tree`)
    ceiling: bool = False     # it drafts the target's own answer: a ceiling, never a winner; its begin() is a whole
                              # plain run, told the generation's length (max_new_tokens)
    lookup: bool = False      # it drafts from the context alone (prompt lookup): HF's prompt lookup is its peer
    assistant: bool = False   # a small LM of the target's tokenizer: HF's assisted generation is its peer
    # --- exported in a form of its own, not a draft folder of the formats (serve/export/formats.py): the target's
    # checkpoint with the drafter's layer merged (MTP), the assistant's own transformers folder (Gemma 4's assistant)
    # (HeadConfig, format) -> None or DraftsmithError: what the format refuses, before anything is read or written
    merge_check: Optional[Callable[[Any, str], None]] = None
    # (native_dir, format, out_dir, *, target, prompts, k, max_new_tokens, overwrite) -> ExportReport
    merge_export: Optional[Callable[..., Any]] = None
    # --- where training starts
    # (fresh head, Target) -> False, or what training starts from instead of the fresh weights (True: the layer the
    # target ships, MTP's; a str: the drafter a recipe names, the Gemma 4 assistant's model.shipped_drafter)
    start: Optional[Callable[[Any, Any], Any]] = None

    @property
    def trained(self) -> bool:
        return self.head is not None


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
        try:
            entry.load()
        except Exception as err:  # another package's code: whatever it raises, say whose it is
            raise MethodError(f"the drafting method {entry.name!r} of an installed package ({entry.value}, entry point "
                              f"{ENTRY_POINTS!r}) fails to import: {type(err).__name__}: {err}; upgrade or uninstall "
                              f"that package") from None


def names(*, trained: bool | None = None) -> tuple[str, ...]:
    """The registered methods' names, sorted (whichever module imported a method folder first); trained: only
    those with (True) or without (False) a trained head."""
    _load()
    return tuple(sorted(n for n, m in _METHODS.items() if trained is None or m.trained == trained))


def find(name: str) -> Optional[Method]:
    _load()
    return _METHODS.get(name)


def method(name: str, *, what: str = "drafting method", trained: bool | None = None) -> Method:
    """The registered method `name`; MethodError naming the registered ones (those with a trained head when
    `trained`) when there is none."""
    found = find(name)
    if found is None or (trained is not None and found.trained != trained):
        kind = "" if trained is None else " trained" if trained else " untrained"
        raise MethodError(f"{what} {name!r} is not a registered{kind} method; registered: "
                          f"{', '.join(names(trained=trained))} (a method of another package registers when that "
                          f"package is imported or installed with a {ENTRY_POINTS!r} entry point)")
    return found


def has(name: str, trait: str) -> bool:
    """Whether the drafter kind `name` (a Drafter's `kind`) is a registered method with `trait` (trees, ceiling,
    lookup, assistant, trained)."""
    found = find(name)
    return bool(found is not None and getattr(found, trait))


def unregister(name: str) -> None:
    """Remove `name` (a test's own method, when the test ends)."""
    _METHODS.pop(name, None)
