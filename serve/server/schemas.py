"""Request and response bodies of the OpenAI-compatible API, and its error body.

Field names and defaults follow the OpenAI API reference (chat completions, legacy completions);
`top_k`, `ignore_eos` and `return_token_ids` are the extensions vLLM also accepts. Unknown request fields are ignored,
as vLLM does, so clients that send newer fields keep working; the OpenAI fields this server cannot honour
(logprobs, tools, penalties, ...) are refused with a 400 naming the field when they ask for something
(`unsupported`), rather than silently ignored. Numbers must be finite (JSON's NaN / Infinity are refused) and
strings valid Unicode (a lone UTF-16 surrogate such as "\ud800" is refused).
"""
from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

MAX_STOP_STRINGS = 4  # the OpenAI API's limit


class APIError(Exception):
    """An error answered with an OpenAI-style body: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status_code: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers  # sent with the response (a 503's Retry-After)

    def body(self) -> dict[str, Any]:
        return error_body(self.message, type=self.type, param=self.param, code=self.code)


def error_body(message: str, *, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def _check_unicode(value: Any) -> None:
    """Refuse a lone UTF-16 surrogate anywhere in `value`: JSON's "\\ud800" escape parses to one, which no
    tokenizer or UTF-8 encoder accepts."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as err:
            raise ValueError(f"contains a lone UTF-16 surrogate (U+{ord(value[err.start]):04X} at character "
                             f"{err.start}), which is not valid Unicode; send UTF-8 text (a \\uD800-\\uDFFF "
                             f"escape must be one half of a surrogate pair)") from None
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_unicode(key)
            _check_unicode(item)
    elif isinstance(value, (list, tuple)) and not (value and isinstance(value[0], int)):  # token ids: all ints
        for item in value:
            _check_unicode(item)


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    @field_validator("*")
    @classmethod
    def _valid_unicode(cls, value: Any) -> Any:
        _check_unicode(value)
        return value

    # field -> (the values that ask for nothing, what the server lacks): a request that sets one of these fields to
    # anything else is refused with a 400 naming it, rather than answered as if the field were not there
    UNSUPPORTED: ClassVar[dict[str, tuple[tuple[Any, ...], str]]] = {}

    def unsupported(self) -> tuple[str, str] | None:
        """(field, what the server lacks) for the first field set to something this server cannot do, or None."""
        for name, (harmless, lacking) in self.UNSUPPORTED.items():
            if getattr(self, name) not in harmless:
                return name, lacking
        return None


class StreamOptions(_Request):
    include_usage: bool = False


class SamplingFields(_Request):
    """Fields both endpoints share."""
    model: str
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0)  # extension: 0 = off
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=-(2**63), le=2**64 - 1)  # what torch.Generator.manual_seed takes
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1)
    ignore_eos: bool = False  # extension: keep generating past end-of-sequence tokens
    # extension (as in vLLM and SGLang): the choice also carries the prompt's and the answer's token ids
    return_token_ids: bool = False
    store: bool | None = None  # false: a recording server (`serve --record`) keeps nothing of this request
    metadata: dict[str, str] | None = None  # `domain` files the request under that domain in the recording
    # accepted only at values that ask for nothing (UNSUPPORTED)
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None

    UNSUPPORTED: ClassVar[dict[str, tuple[tuple[Any, ...], str]]] = {
        "presence_penalty": ((None, 0.0), "no penalties"), "frequency_penalty": ((None, 0.0), "no penalties"),
        "logit_bias": ((None, {}), "no logit bias")}

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
    content: str | list[ContentPart]
    tool_calls: list[Any] | None = None  # refused (UNSUPPORTED)

    UNSUPPORTED: ClassVar[dict[str, tuple[tuple[Any, ...], str]]] = {"tool_calls": ((None, []), "no function calling")}

    @field_validator("content", mode="before")
    @classmethod
    def _content_not_null(cls, value: Any) -> Any:
        if value is None:  # OpenAI allows it only on an assistant turn that carries tool_calls
            raise ValueError("must be a string or a list of text parts, not null (null content belongs to an "
                             "assistant turn with tool_calls, and this server does not do function calling)")
        return value

    def text(self) -> str:
        """The message as plain text; only text parts are supported (no images or audio)."""
        if isinstance(self.content, str):
            return self.content
        for part in self.content:
            if part.type != "text" or part.text is None:
                raise APIError(400, f"content parts of type {part.type!r} are not supported; send text",
                               param="messages")
        return "".join(part.text or "" for part in self.content)


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)  # newer name of max_tokens
    # accepted only at values that ask for nothing (UNSUPPORTED)
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    functions: list[Any] | None = None  # the deprecated spellings of tools / tool_choice
    function_call: Any = None
    response_format: dict[str, Any] | None = None

    UNSUPPORTED: ClassVar[dict[str, tuple[tuple[Any, ...], str]]] = {
        **SamplingFields.UNSUPPORTED, "logprobs": ((None, False), "no log-probabilities"),
        "top_logprobs": ((None, 0), "no log-probabilities"), "tools": ((None, []), "no function calling"),
        "tool_choice": ((None, "none"), "no function calling"), "functions": ((None, []), "no function calling"),
        "function_call": ((None, "none"), "no function calling"),
        "response_format": ((None, {"type": "text"}), "no structured output: text only")}

    def unsupported(self) -> tuple[str, str] | None:
        for i, message in enumerate(self.messages):
            found = message.unsupported()
            if found is not None:
                return f"messages.{i}.{found[0]}", found[1]
        return super().unsupported()

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(SamplingFields):
    # A string or one list of token ids; several prompts per request are refused (see app.py).
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(16, ge=1)  # the legacy API's default
    # accepted only at values that ask for nothing (UNSUPPORTED)
    echo: bool = False
    logprobs: int | None = None
    suffix: str | None = None
    best_of: int | None = None

    UNSUPPORTED: ClassVar[dict[str, tuple[tuple[Any, ...], str]]] = {
        **SamplingFields.UNSUPPORTED, "echo": ((False,), "no echo"), "logprobs": ((None,), "no log-probabilities"),
        "suffix": ((None,), "no insertion"), "best_of": ((None, 1), "one completion per request")}

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
    root: str  # the target as given (path or hub id), as vLLM lists it
    max_model_len: int
    drafter: str
    num_speculative_tokens: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
