"""One prompt encoder: what the target reads before it writes the next assistant turn.

With a chat template, the template renders the conversation with the assistant turn opened
(add_generation_prompt) and writes any BOS itself, so its text is encoded without special tokens. Without
one (base models), a single prompt is its raw text encoded with the tokenizer's special tokens (e.g. BOS).
Data building, evaluation, generation, the server, export checks and the demo all encode prompts here.
"""
from __future__ import annotations

from typing import Any, Sequence

from draftsmith.serve.core.errors import TargetError


def has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def render_chat(tokenizer: Any, messages: Sequence[dict]) -> list[int]:
    """Token ids of `messages` in the target's chat template, the assistant turn opened."""
    if not has_chat_template(tokenizer):
        raise TargetError("the target's tokenizer has no chat template, so messages cannot be formatted; "
                          "send the raw prompt text instead")
    text = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=False)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def encode_prompt(tokenizer: Any, text: str, *, chat: bool | None = None) -> list[int]:
    """One user prompt -> token ids. chat: True = the chat template (an error without one), False = the raw
    text, None = the chat template when the tokenizer has one."""
    if chat is None:
        chat = has_chat_template(tokenizer)
    if chat:
        return render_chat(tokenizer, [{"role": "user", "content": text}])
    return list(tokenizer(text)["input_ids"])
