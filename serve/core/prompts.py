"""One prompt renderer: what the target reads before it writes the next assistant turn.

With a chat template, the template renders the conversation with the assistant turn opened
(add_generation_prompt) and writes any BOS itself, so its text is encoded without special tokens. Without
one (base models), the conversation is plain text: the messages' texts concatenated, an assistant piece right after
its prompt (prompt + completion), a later prompt after a blank line, the first encoded with the tokenizer's special
tokens (e.g. BOS); a single prompt is its raw text. Data building (which also marks the assistant pieces for the
loss: `render_plain`), evaluation, generation, the server, export checks and the demo all render prompts here, so a
base model is evaluated on the same text it was trained on.
"""
from __future__ import annotations

from typing import Any, Sequence

from draftsmith.serve.core.errors import DraftsmithError, TargetError

PLAIN_SEPARATOR = "\n\n"  # between a completion and the next prompt in plain (template-less) rendering


def has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def render_chat(tokenizer: Any, messages: Sequence[dict]) -> list[int]:
    """Token ids of `messages` in the target's chat template, the assistant turn opened."""
    if not has_chat_template(tokenizer):
        raise TargetError("the target's tokenizer has no chat template, so messages cannot be formatted; "
                          "send the raw prompt text instead")
    text = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=False)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def render_plain(tokenizer: Any, messages: Sequence[dict], *, close: bool) -> tuple[list[int], list[int]]:
    """Template-less rendering (module docstring) -> (token ids, 1 on the assistant pieces' tokens); `close` appends
    the EOS that ends the last completion."""
    input_ids: list[int] = []
    assistant_mask: list[int] = []
    for j, message in enumerate(messages):
        assistant = message["role"] == "assistant"
        if j > 0 and not assistant:
            sep = tokenizer(PLAIN_SEPARATOR, add_special_tokens=False)["input_ids"]
            input_ids += sep
            assistant_mask += [0] * len(sep)
        piece = tokenizer(message["content"], add_special_tokens=j == 0)["input_ids"]
        input_ids += piece
        assistant_mask += [int(assistant)] * len(piece)
    if close:
        if tokenizer.eos_token_id is None:
            raise DraftsmithError("the tokenizer has no EOS token to end a completion with")
        input_ids.append(tokenizer.eos_token_id)
        assistant_mask.append(1)
    return input_ids, assistant_mask


def render_prompt(tokenizer: Any, messages: Sequence[dict], *, chat: bool | None = None) -> list[int]:
    """Token ids the target reads to write the next assistant turn after `messages`. chat: True = the chat template
    (an error without one), False = plain text, None = the chat template when the tokenizer has one."""
    if chat is None:
        chat = has_chat_template(tokenizer)
    if chat:
        return render_chat(tokenizer, messages)
    return render_plain(tokenizer, messages, close=False)[0]


def encode_prompt(tokenizer: Any, text: str, *, chat: bool | None = None) -> list[int]:
    """One user prompt -> token ids (render_prompt of that one message: the raw text without a template)."""
    return render_prompt(tokenizer, [{"role": "user", "content": text}], chat=chat)
