"""Evaluation prompts: load them (with an optional domain label per source), render them for the target,
group them by domain.

Sources are whatever `data.prompts.load_prompts` accepts (JSONL files, `builtin`, `builtin:<domain>`),
optionally prefixed `DOMAIN=` to set the domain of every row of that source (for sets without a domain
field), e.g. `code=../shared/data/eval/humaneval.jsonl`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from serve.errors import DraftsmithError

_LABEL = re.compile(r"^[A-Za-z0-9_.\-]+$")


@dataclass
class EvalPrompt:
    id: str
    domain: str
    input_ids: list[int]  # the rendered prompt, ready for the target


def split_label(source: str) -> tuple[str | None, str]:
    """`code=path.jsonl` -> ("code", "path.jsonl"); a plain source -> (None, source)."""
    if "=" in source and not Path(source).exists():
        label, rest = source.split("=", 1)
        if _LABEL.match(label) and rest:
            return label, rest
    return None, source


def load_sources(sources: Sequence[str], *, domain_field: str = "domain", limit: int | None = None) -> list[Any]:
    """Rows (`PromptRow(id, domain, messages)`) of every source, in order; `DOMAIN=` labels applied.

    Row ids are made unique across sources (a `#n` suffix on repeats) so records can be told apart.
    """
    from data.prompts import load_prompts, make_ids_unique

    rows: list[Any] = []
    for source in sources:
        label, path = split_label(source)
        loaded = load_prompts(path, domain_field=domain_field, limit=None)
        for row in loaded:
            rows.append(_Row(id=str(row.id), domain=label or str(row.domain), messages=list(row.messages)))
    if not rows:
        raise DraftsmithError(f"no prompts found in {', '.join(sources)}")
    make_ids_unique(rows)
    return limit_per_domain(rows, limit)


@dataclass
class _Row:
    id: str
    domain: str
    messages: list[dict]


def limit_per_domain(rows: Iterable[Any], limit: int | None) -> list[Any]:
    """Keep the first `limit` rows of each domain (all when limit is None), in their original order."""
    if limit is not None and limit <= 0:
        raise DraftsmithError(f"limit must be positive, got {limit}")
    kept, counts = [], {}
    for row in rows:
        n = counts.get(row.domain, 0)
        if limit is None or n < limit:
            kept.append(row)
            counts[row.domain] = n + 1
    return kept


def prompt_messages(messages: Sequence[dict]) -> list[dict]:
    """The conversation up to and including its last user turn (what the target is asked to answer)."""
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=None)
    if last_user is None:
        raise DraftsmithError(f"a prompt has no user turn: {list(messages)[:2]!r}")
    return list(messages[: last_user + 1])


def render_prompt(tokenizer: Any, messages: Sequence[dict]) -> list[int]:
    """Token ids of the prompt: the chat template with the generation prompt when the tokenizer has one,
    otherwise the raw text of the last user turn (base models)."""
    from data.masks import render_prompt as render

    convo = prompt_messages(messages)
    if getattr(tokenizer, "chat_template", None):
        return render(tokenizer, convo, chat=True)
    return render(tokenizer, convo[-1:], chat=False)


def prepare_prompts(tokenizer: Any, rows: Iterable[Any]) -> list[EvalPrompt]:
    return [EvalPrompt(id=str(r.id), domain=str(r.domain), input_ids=render_prompt(tokenizer, r.messages))
            for r in rows]


def group_by_domain(prompts: Iterable[Any]) -> dict[str, list[int]]:
    """domain -> indices of its prompts, domains in order of first appearance."""
    groups: dict[str, list[int]] = {}
    for i, p in enumerate(prompts):
        groups.setdefault(p.domain, []).append(i)
    return groups
