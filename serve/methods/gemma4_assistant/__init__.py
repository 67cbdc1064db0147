"""Gemma 4's assistant: the small drafter Google ships beside a Gemma 4 target (transformers' gemma4_assistant), whose
layers attend to the target's own keys and values and draft K tokens from one position. Its drafter (drafter.py) and
how its spec `gemma4_assistant:DIR[:length=fixed]` reads and builds (below); the decoder hands it the target's cache
(`Drafter.watch_cache`; the batched decoder each row's view of its slot cache, the rows drafting together).

Fine-tuned for a fine-tuned target (`train model.method=gemma4_assistant`, online only, from the shipped assistant
`model.shipped_drafter=DIR` or fresh with `model.draft_layers` layers): its head (head.py), objective (objective.py),
the drafter folder training writes (`--drafter DIR`), and its export, the assistant's transformers folder that vLLM
and SGLang serve (export.py)."""
from __future__ import annotations

from pathlib import Path

from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.core.target import Target
from draftsmith.serve.drafters.spec import DrafterSpec, DrafterSpecError, path_options, split_tree
from draftsmith.serve.drafters.target_policy import length_policy
from draftsmith.serve.core.layers import FINAL
from draftsmith.serve.methods.gemma4_assistant.drafter import AssistantDrafter, load_assistant
from draftsmith.serve.methods.gemma4_assistant.export import check_format, export_assistant
from draftsmith.serve.methods.gemma4_assistant.head import AssistantHead, assistant_head_config
from draftsmith.serve.methods.gemma4_assistant.objective import assistant_objective
from draftsmith.serve.methods.registry import Method, register

# the spec's first word and this folder's name; not `assistant`, a chat role the project compares with
# (tests/test_method_strings.py)
NAME = "gemma4_assistant"
OPTIONS = ("length",)


def _parse(rest: str, common: dict) -> DrafterSpec:
    if not rest:
        raise DrafterSpecError("the Gemma 4 assistant drafter needs a folder: gemma4_assistant:DIR (model_type "
                               "gemma4_assistant)")
    path, opts = path_options(rest, common["text"], exists=Path.is_dir)
    path = path or rest
    if not Path(path).is_dir():
        raise DrafterSpecError(f"no such Gemma 4 assistant folder: {path} (from the drafter spec {common['text']!r})")
    return DrafterSpec(kind=NAME, path=path, options=opts, **common)


def _build(parsed: DrafterSpec, target: Target, opts: dict) -> AssistantDrafter:
    given = {**parsed.options, **opts}
    unknown = sorted(set(given) - set(OPTIONS))
    if unknown:
        raise DrafterSpecError(f"unknown gemma4_assistant option(s) {unknown}; valid: {', '.join(OPTIONS)}")
    try:
        model, tokenizer = load_assistant(parsed.path, target)
        drafter = AssistantDrafter(model, target, folder=parsed.path, tokenizer=tokenizer,
                                   policy=length_policy(target, str(given.get("length", "auto"))))
        drafter.check_target(target)  # its tokenizer, when its folder holds one
        return drafter
    except DraftsmithError as err:
        raise DrafterSpecError(str(err)) from None


def _config(model, target: Target):
    return assistant_head_config(target, num_speculative_tokens=model.num_speculative_tokens,
                                 ttt_steps=min(model.ttt_steps, model.num_speculative_tokens),
                                 shipped=model.shipped_drafter, layers=model.draft_layers)


def _drafter(head: AssistantHead, target: Target, *, check: bool = True, policy=None, leaves: int = 0):
    return AssistantDrafter(head.assistant, target, folder=f"trained for {head.config.target_name}", policy=policy)


def _check(config) -> None:
    if config.data.mode != "online":
        raise DraftsmithError(f"model.method={NAME} trains online only (data.mode=online): its loss reads the "
                              f"target's keys and values of its store layers, which a hidden-state cache does not hold")


METHOD = register(Method(
    name=NAME, title="Gemma 4 assistant", usage=f"{NAME}:DIR", parse=_parse, build=_build,
    label=lambda rest: f"{NAME}:" + Path(split_tree(rest)[0]).name,
    config=_config, head=AssistantHead, drafter=_drafter, objective=assistant_objective,
    layers=lambda num_layers: (FINAL,), unroll=lambda model, cfg, length: cfg.ttt_steps, check=_check,
    options=("shipped_drafter", "draft_layers"), merge_check=check_format, merge_export=export_assistant,
    start=AssistantHead.start_from_target))
