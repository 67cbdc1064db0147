"""Request -> prompt token ids, and the generation budget that fits the context window."""
from __future__ import annotations

from typing import Any

from draftsmith.serve.core import prompts
from draftsmith.serve.server.schemas import APIError, ChatMessage, CompletionRequest


def render_chat(tokenizer: Any, messages: list[ChatMessage]) -> list[int]:
    """The target's own chat template with the assistant turn opened (draftsmith.serve.core.prompts.render_chat)."""
    if not prompts.has_chat_template(tokenizer):
        raise APIError(400, "this model's tokenizer has no chat template, so /v1/chat/completions cannot "
                       "format messages; send a raw prompt to /v1/completions instead",
                       param="messages", code="chat_template_missing")
    conversation = [{"role": m.role, "content": m.text()} for m in messages]
    from jinja2 import TemplateError

    try:
        return prompts.render_chat(tokenizer, conversation)
    except TemplateError as err:  # e.g. a template that requires alternating user/assistant roles
        raise APIError(400, f"the chat template rejected these messages: {err}", param="messages") from None


def completion_prompt(body: CompletionRequest) -> str | list[int]:
    """The request's one prompt: a string, or a list of token ids (several prompts per request are refused)."""
    prompt = body.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) != 1:
            raise APIError(400, f"one prompt per request is supported, got {len(prompt)}; send them as "
                           f"separate requests", param="prompt")
        prompt = prompt[0]
    return prompt


def encode_text_prompt(tokenizer: Any, prompt: str) -> list[int]:
    """A completion prompt's ids: encoded with the tokenizer's special tokens (e.g. BOS)."""
    return prompts.encode_prompt(tokenizer, prompt, chat=False)


def check_token_ids(token_ids: list[int], vocab_size: int) -> list[int]:
    """A prompt sent as token ids, once every id is in the vocabulary (min / max: a million ids in milliseconds)."""
    if token_ids and (min(token_ids) < 0 or max(token_ids) >= vocab_size):
        bad = next(t for t in token_ids if not 0 <= t < vocab_size)
        raise APIError(400, f"token id {bad} is out of range for a vocabulary of {vocab_size}", param="prompt")
    return list(token_ids)


def resolve_max_tokens(*, prompt_tokens: int, requested: int | None, context_length: int, param: str) -> int:
    """The number of new tokens to generate; a request that cannot fit the context window is a 400."""
    if prompt_tokens == 0:
        raise APIError(400, "the prompt is empty", param=param)
    max_tokens = requested if requested is not None else context_length - prompt_tokens
    if max_tokens < 1 or prompt_tokens + max_tokens > context_length:
        raise APIError(400, f"This model's maximum context length is {context_length} tokens. However, you "
                       f"requested {prompt_tokens + max(max_tokens, 0)} tokens ({prompt_tokens} in the "
                       f"{param}, {max(max_tokens, 0)} in the completion). Please reduce the length of the "
                       f"{param} or completion.", param=param, code="context_length_exceeded")
    return max_tokens
