"""Which assistant turns the target must write for a prompt row, and prompts that do not fit the context.

A `Conversation` holds the row's messages with an empty slot (`content is None`) for every assistant turn
the target will write: after each user turn that has no answer, and, with `regenerate`, in place of the
answers the row already gives (the drafter must learn the target's answers, not another model's).

Rows whose answers are kept (`keeps_answers`) cost no generation: the target reads them teacher-forced, and the
drafter still learns the target's own distribution at every position (the soft targets come from the target),
only in contexts another writer produced. A fraction of such rows buys tokens at the price of a forward pass.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

from draftsmith.data.masks import render_prompt
from draftsmith.data.prompts import PromptRow


@dataclass
class Conversation:
    id: str
    domain: str
    messages: list[dict]  # assistant slots still to write have content None

    def next_slot(self) -> int | None:
        return next((i for i, m in enumerate(self.messages) if m["content"] is None), None)

    def turns_left(self) -> int:
        """The answers still to write."""
        return sum(m["content"] is None for m in self.messages)

    def drop_from(self, index: int) -> int:
        """Drop message `index` and everything after it (a turn that no longer fits); returns slots dropped."""
        dropped = sum(m["content"] is None for m in self.messages[index:])
        del self.messages[index:]
        return dropped


def keeps_answers(row_id: str, fraction: float) -> bool:
    """Whether a row is one of the `fraction` that keep their own answers: a hash of its id, so the choice of a
    row does not change when the prompt set grows."""
    return fraction > 0 and zlib.crc32(row_id.encode()) / 2 ** 32 < fraction


def plan_conversation(row: PromptRow, *, regenerate: bool) -> Conversation:
    messages: list[dict] = []
    source = [m for m in row.messages if not (regenerate and m["role"] == "assistant")]
    for i, message in enumerate(source):
        messages.append(dict(message))
        answered = i + 1 < len(source) and source[i + 1]["role"] == "assistant"
        if message["role"] == "user" and not answered:
            messages.append({"role": "assistant", "content": None})
    return Conversation(id=row.id, domain=row.domain, messages=messages)


def fit_prompt(tokenizer: Any, messages: list[dict], *, chat: bool, max_tokens: int) -> list[int] | None:
    """Prompt ids with the longest turn of `messages` cut short until they fit `max_tokens` (None: cannot fit).

    The turn keeps its beginning (where instructions usually are); a binary search over its length in
    characters needs about log2(length) renders.
    """
    longest = max(range(len(messages)), key=lambda i: len(messages[i]["content"]))
    content = messages[longest]["content"]

    def ids_for(length: int) -> list[int]:
        trial = [dict(m) for m in messages]
        trial[longest]["content"] = content[:length]
        return render_prompt(tokenizer, trial, chat=chat)

    if len(ids_for(0)) > max_tokens:
        return None
    low, high = 0, len(content)  # ids_for(low) fits; ids_for(high) does not
    while high - low > 1:
        mid = (low + high) // 2
        if len(ids_for(mid)) <= max_tokens:
            low = mid
        else:
            high = mid
    messages[longest]["content"] = content[:low]
    return ids_for(low)
