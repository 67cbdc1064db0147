"""Validators shared by every export format.

An exported folder is checked against what the engine reads (a `FormatSpec`, written from the engine's
source, independently of the writer): config keys and values, tensor names, shapes and dtypes from the
target's config, no untrained embeddings; then it is read back into a draftsmith Drafter and run in our
decoder next to the native drafter: the proposals must agree token by token and μ must match.
Every failure raises ExportError naming the field and the expected value.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from draftsmith.serve.drafters.base import Draft, Drafter
# an export keeps the native folder's (HF's) names
from draftsmith.serve.drafters.folder import CONFIG_NAME, WEIGHTS_NAME
from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.core.target import Target

PROVENANCE_KEY = "draftsmith_export"  # config.json entry recording what was exported, from what, for which target
ABSENT = object()  # FormatSpec value: the key must not be there


class ExportError(DraftsmithError):
    """An exported folder that a serving engine would read differently from the native drafter."""


@dataclass
class Expect:
    """One config field the engine reads: its expected value, the values also accepted, and why it matters."""
    value: Any
    why: str = ""
    also: tuple = ()  # other accepted values (e.g. ABSENT when the engine's default is right)


@dataclass(frozen=True)
class TargetFacts:
    """What format writers, validators and readers need to know of the target."""
    text: dict                  # its text config (hidden size, vocabulary, layers, ...) as a dict
    architectures: list[str]
    verifier: str               # what an engine should load as the target: its local folder if any, else its name

    @property
    def num_layers(self) -> int:
        return int(self.text["num_hidden_layers"])

    @property
    def verifier_is_local(self) -> bool:
        return Path(self.verifier).exists()


def target_facts(target: Target, *, verifier: str | None = None) -> TargetFacts:
    from draftsmith.serve.core.target import text_config

    path = Path(target.path)
    default = str(path.resolve()) if path.is_dir() else target.name
    text = text_config(target.config)
    # a count some configs derive instead of storing (Nemotron-H's, from layers_block_type)
    facts = {**text.to_dict(), "num_hidden_layers": int(text.num_hidden_layers)}
    return TargetFacts(text=facts,
                       architectures=list(getattr(target.config, "architectures", None) or []),
                       verifier=verifier or default)


@dataclass
class FormatSpec:
    """What an engine reads for one method, derived from the native drafter and the target's config."""
    fmt: str
    method: str
    config: dict[str, Expect]                       # dotted key -> expectation
    tensors: dict[str, tuple[tuple[int, ...], torch.dtype | None]]  # name -> (shape, dtype or None = floating)
    engine_layer_ids: list[int] = field(default_factory=list)


# --------------------------------------------------------------------------------------------- reading

def read_config(folder: str | Path) -> dict:
    path = Path(folder) / CONFIG_NAME
    if not path.is_file():
        raise ExportError(f"{folder}: no {CONFIG_NAME}")
    return json.loads(path.read_text())


def read_tensors(folder: str | Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(folder) / WEIGHTS_NAME
    if not path.is_file():
        raise ExportError(f"{folder}: no {WEIGHTS_NAME}")
    try:  # as the engines read it: they ignore checksums.json, so the read-back does too
        return load_file(str(path))
    except SafetensorError as err:
        raise ExportError(f"{path} cannot be read as safetensors ({' '.join(str(err).split())}): the file is "
                          f"damaged; export again") from None


def lookup(config: dict, dotted: str) -> Any:
    """config["a"]["b"][0] for "a.b.0"; ABSENT when any part is missing."""
    node: Any = config
    for part in dotted.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return ABSENT
    return node


def get_field(config: dict, dotted: str, default: Any) -> Any:
    """The value an engine reads for `dotted`, or its default when the key is missing or null."""
    value = lookup(config, dotted)
    return default if value is ABSENT or value is None else value


def _same(got: Any, want: Any) -> bool:
    if want is ABSENT or got is ABSENT:
        return got is want
    if isinstance(want, bool) or isinstance(got, bool):
        return type(got) is type(want) and got == want
    if isinstance(want, float) or isinstance(got, float):
        return isinstance(got, (int, float)) and math.isclose(float(got), float(want), rel_tol=1e-6, abs_tol=0.0)
    if isinstance(want, (list, tuple)):
        return isinstance(got, (list, tuple)) and len(got) == len(want) and all(_same(g, w) for g, w in zip(got, want))
    if isinstance(want, dict):
        return isinstance(got, dict) and set(got) == set(want) and all(_same(got[k], want[k]) for k in want)
    return got == want


def _show(value: Any) -> str:
    return "absent" if value is ABSENT else json.dumps(value)


# --------------------------------------------------------------------------------------------- checks

def check_config(config: dict, spec: FormatSpec, *, where: str) -> None:
    """Every expected field present with its expected value."""
    for key, expect in spec.config.items():
        got = lookup(config, key)
        if _same(got, expect.value) or any(_same(got, other) for other in expect.also):
            continue
        why = f" ({expect.why})" if expect.why else ""
        state = "missing" if got is ABSENT else f"is {_show(got)}"
        raise ExportError(f"{where}: config field {key!r} {state}, expected {_show(expect.value)}{why}")


def check_tensors(tensors: dict[str, torch.Tensor], spec: FormatSpec, *, where: str) -> None:
    """Exactly the expected tensor names, each with its expected shape and dtype."""
    missing = sorted(set(spec.tensors) - set(tensors))
    if missing:
        shape, _ = spec.tensors[missing[0]]
        raise ExportError(f"{where}: tensor {missing[0]!r} is missing (expected shape {list(shape)}); "
                          f"{spec.fmt} would leave it at its random initialization"
                          + (f"; also missing: {missing[1:6]}" if len(missing) > 1 else ""))
    unexpected = sorted(set(tensors) - set(spec.tensors))
    if unexpected:
        raise ExportError(f"{where}: unexpected tensor {unexpected[0]!r}: {spec.fmt} {spec.method} reads no such "
                          f"name (it would be ignored or fail to load); expected only {sorted(spec.tensors)[:8]}...")
    for name, (shape, dtype) in spec.tensors.items():
        tensor = tensors[name]
        if tuple(tensor.shape) != tuple(shape):
            raise ExportError(f"{where}: tensor {name!r} has shape {list(tensor.shape)}, expected {list(shape)} "
                              f"(from the target's config)")
        if dtype is None and not tensor.is_floating_point():
            raise ExportError(f"{where}: tensor {name!r} has dtype {tensor.dtype}, expected a floating dtype")
        if dtype is not None and tensor.dtype != dtype:
            raise ExportError(f"{where}: tensor {name!r} has dtype {tensor.dtype}, expected {dtype}")
        if dtype is None and not bool(torch.isfinite(tensor).all()):
            raise ExportError(f"{where}: tensor {name!r} has NaN or infinite values")


def check_no_untrained_embeddings(tensors: dict[str, torch.Tensor], target: Target, *, where: str) -> None:
    """Drafters never train embeddings: engines share the target's when the draft folder has none."""
    for name, tensor in tensors.items():
        if "embed_tokens" not in name:
            continue
        weight = target.model.get_input_embeddings().weight.detach().cpu()
        same = tuple(tensor.shape) == tuple(weight.shape) and torch.equal(tensor.to(weight.dtype), weight)
        detail = ("it equals the target's own embeddings, which the engine shares anyway" if same else
                  "it differs from the target's embeddings: an untrained (random) copy the engine would use "
                  "instead of the target's")
        raise ExportError(f"{where}: tensor {name!r} must be absent (the drafter trained no embeddings); {detail}")


def check_layer_ids(config: dict, spec: FormatSpec, *, native_ids: list[int], engine: str, where: str) -> None:
    """The aux layer ids are recorded in both conventions next to the engine's own key."""
    from draftsmith.serve.export.layer_ids import CONVENTIONS

    recorded = lookup(config, f"{PROVENANCE_KEY}.aux_layer_ids")
    want = {"draftsmith": list(native_ids), engine: list(spec.engine_layer_ids),
            "draftsmith_convention": CONVENTIONS["draftsmith"], f"{engine}_convention": CONVENTIONS[engine]}
    if not _same(recorded, want):
        raise ExportError(f"{where}: config field '{PROVENANCE_KEY}.aux_layer_ids' is {_show(recorded)}, "
                          f"expected {_show(want)}")


# ---------------------------------------------------------------------------------- drafts side by side

class RecordingDrafter(Drafter):
    """Passes every call through to `inner` and keeps each proposal's token ids."""

    def __init__(self, inner: Drafter):
        self.inner = inner
        self.kind = inner.kind
        self.target_layers = tuple(inner.target_layers)
        self.proposals: list[list[int]] = []

    def begin(self, prompt_ids, next_tokens, hidden_states) -> None:
        self.inner.begin(prompt_ids, next_tokens, hidden_states)

    def draft_cap(self, k: int) -> int:
        return self.inner.draft_cap(k)

    def propose(self, k: int, *, temperature: float = 0.0, generator=None, tree=None) -> Draft:
        draft = self.inner.propose(k, temperature=temperature, generator=generator, tree=tree)
        self.proposals.append([int(t) for t in draft.tokens])
        return draft

    def commit(self, next_tokens, hidden_states) -> None:
        self.inner.commit(next_tokens, hidden_states)

    def parts(self) -> tuple[Drafter, ...]:
        return self.inner.parts()  # a drafter that reads the target's cache is handed it (watch_cache)


@dataclass
class DraftComparison:
    prompts: int
    cycles: int
    proposals_compared: int
    mu_native: float
    mu_readback: float
    new_tokens: int


PROMPTS = ("Write a short Python function that reverses a string.",
           "Explain in two sentences why the sky is blue.",
           "List three prime numbers and add them up.",
           "Give me a recipe for a simple tomato soup.",
           "Translate 'good morning, how are you?' into French and Spanish.",
           "What is the difference between a list and a tuple in Python?",
           "Summarize the plot of Romeo and Juliet in three sentences.",
           "Write a haiku about autumn leaves.")


def default_prompts(target: Target, *, count: int = 3) -> list[torch.Tensor]:
    """A few short prompts, chat-formatted when the target has a chat template; (1, T) each."""
    if not 1 <= count <= len(PROMPTS):
        raise DraftsmithError(f"validation prompts: choose 1..{len(PROMPTS)}, got {count}")
    texts = PROMPTS[:count]
    tok = target.tokenizer
    out = []
    for text in texts:
        if getattr(tok, "chat_template", None):
            ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                          return_dict=True)["input_ids"]
        else:
            ids = tok.encode(text)
        out.append(torch.tensor([list(ids)]))
    return out


def compare_drafts(target: Target, native: Drafter, readback: Drafter, prompts: list[torch.Tensor], *, k: int,
                   max_new_tokens: int, where: str) -> DraftComparison:
    """Greedy generation with each drafter; every proposal of the read-back drafter must equal the native one."""
    from draftsmith.serve.decoding import speculative_generate

    forwards = {"native": 0, "readback": 0}
    tokens = {"native": 0, "readback": 0}
    cycles = compared = new_tokens = 0
    for p, input_ids in enumerate(prompts):
        runs = {}
        for name, drafter in (("native", native), ("readback", readback)):
            recorder = RecordingDrafter(drafter)
            result = speculative_generate(target, recorder, input_ids, max_new_tokens=max_new_tokens, k=k)
            runs[name] = (recorder.proposals, result)
            forwards[name] += result.stats.target_forwards
            tokens[name] += result.stats.new_tokens
        (native_props, native_res), (read_props, read_res) = runs["native"], runs["readback"]
        for cycle, (a, b) in enumerate(zip(native_props, read_props)):
            if a != b:
                raise ExportError(f"{where}: the read-back drafter proposes {b} where the native drafter proposes {a} "
                                  f"(prompt {p}, cycle {cycle}); expected identical drafts")
        if len(native_props) != len(read_props) or native_res.output_ids != read_res.output_ids:
            raise ExportError(f"{where}: prompt {p}: {len(read_props)} read-back cycles vs {len(native_props)} native; "
                              f"expected identical runs")
        cycles += len(native_props)
        compared += sum(len(a) for a in native_props)
        new_tokens += native_res.stats.new_tokens
    mu_native = tokens["native"] / max(forwards["native"], 1)
    mu_readback = tokens["readback"] / max(forwards["readback"], 1)
    if not math.isclose(mu_native, mu_readback, rel_tol=1e-9):
        raise ExportError(f"{where}: μ read back {mu_readback:.4f}, expected the native μ {mu_native:.4f}")
    return DraftComparison(prompts=len(prompts), cycles=cycles, proposals_compared=compared, mu_native=mu_native,
                           mu_readback=mu_readback, new_tokens=new_tokens)


def record_readback(report: Any, target: Target, native: Drafter, readback: Drafter, prompts, *, k: int,
                    max_new_tokens: int, where: str, read_as: str) -> None:
    """compare_drafts (default prompts when none are given) written into an ExportReport: its k, prompts, cycles,
    proposals and μ, and the check line ("read back {read_as}: N proposed tokens ... identical")."""
    comparison = compare_drafts(target, native, readback, prompts if prompts is not None else default_prompts(target),
                                k=k, max_new_tokens=max_new_tokens, where=where)
    report.k, report.prompts, report.cycles = k, comparison.prompts, comparison.cycles
    report.proposals_compared = comparison.proposals_compared
    report.mu_native, report.mu_readback = comparison.mu_native, comparison.mu_readback
    report.checks.append(f"read back {read_as}: {comparison.proposals_compared} proposed tokens in "
                         f"{comparison.cycles} cycles identical to the native drafter's; mu "
                         f"{comparison.mu_readback:.3f} = {comparison.mu_native:.3f}")
