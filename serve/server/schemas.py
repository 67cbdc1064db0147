"""Request and response bodies of the OpenAI-compatible API, and its error body.

Field names and defaults follow the OpenAI API reference (chat completions, legacy completions);
`top_k`, `ignore_eos` and `return_token_ids` are the extensions vLLM also accepts. Unknown request fields are ignored,
as vLLM does, so clients that send newer fields keep working.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

MAX_STOP_STRINGS = 4  # the OpenAI API's limit


class APIError(Exception):
    """An error answered with an OpenAI-style body: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status_code: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return error_body(self.message, type=self.type, param=self.param, code=self.code)


def error_body(message: str, *, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(_Request):
    include_usage: bool = False


class SamplingFields(_Request):
    """Fields both endpoints share."""
    model: str
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0)  # extension: 0 = off
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1)
    ignore_eos: bool = False  # extension: keep generating past end-of-sequence tokens
    # extension (as in vLLM and SGLang): the choice also carries the prompt's and the answer's token ids
    return_token_ids: bool = False
    store: bool | None = None  # false: a recording server (`serve --record`) keeps nothing of this request
    metadata: dict[str, str] | None = None  # `domain` files the request under that domain in the recording

    @field_validator("stop")
    @classmethod
    def _check_stop(cls, value: str | list[str] | None) -> str | list[str] | None:
        stops = [value] if isinstance(value, str) else (value or [])
        if len(stops) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop sequences are allowed, got {len(stops)}")
        if any(s == "" for s in stops):
            raise ValueError("stop sequences must be non-empty strings")
        return value

    @property
    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ContentPart(_Request):
    type: str
    text: str | None = None


class ChatMessage(_Request):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None

    def text(self) -> str:
        """The message as plain text; only text parts are supported (no images or audio)."""
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        for part in self.content:
            if part.type != "text" or part.text is None:
                raise APIError(400, f"content parts of type {part.type!r} are not supported; send text",
                               param="messages")
        return "".join(part.text or "" for part in self.content)


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)  # newer name of max_tokens

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(SamplingFields):
    # A string or one list of token ids; several prompts per request are refused (see app.py).
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(16, ge=1)  # the legacy API's default
    echo: bool = False
    logprobs: int | None = None
    suffix: str | None = None

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_tokens


class Usage(BaseModel):
    """OpenAI usage plus the speculative decoder's per-request statistics."""
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    mu: float  # new tokens per target forward, bonus token included (1.0 = plain decoding)
    target_forwards: int
    accepted_tokens: int  # draft tokens accepted, summed over cycles
    cycles: int
    draft_seconds: float
    verify_seconds: float
    drafter: str
    k: int


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "draftsmith"
    max_model_len: int
    drafter: str
    num_speculative_tokens: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
