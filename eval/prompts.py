"""Evaluation prompts: render the rows `data.prompts.read_prompts` reads (DOMAIN= labels, per-domain limits)
for the target, and group them by domain."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.core.prompts import render_prompt as render_next_turn


@dataclass
class EvalPrompt:
    id: str
    domain: str
    input_ids: list[int]  # the rendered prompt, ready for the target


def prompt_messages(messages: Sequence[dict]) -> list[dict]:
    """The conversation up to and including its last user turn (what the target is asked to answer)."""
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=None)
    if last_user is None:
        raise DraftsmithError(f"a prompt has no user turn: {list(messages)[:2]!r}")
    return list(messages[: last_user + 1])


def render_prompt(tokenizer: Any, messages: Sequence[dict]) -> list[int]:
    """Token ids of the prompt: the conversation up to its last user turn, rendered as the target was trained on it
    (serve/core/prompts.py: the chat template with the generation prompt, or a base model's plain text of every
    turn)."""
    return render_next_turn(tokenizer, prompt_messages(messages))


def prepare_prompts(tokenizer: Any, rows: Iterable[Any]) -> list[EvalPrompt]:
    return [EvalPrompt(id=str(r.id), domain=str(r.domain), input_ids=render_prompt(tokenizer, r.messages))
            for r in rows]


def group_by_domain(prompts: Iterable[Any]) -> dict[str, list[int]]:
    """domain -> indices of its prompts, domains in order of first appearance."""
    groups: dict[str, list[int]] = {}
    for i, p in enumerate(prompts):
        groups.setdefault(p.domain, []).append(i)
    return groups
