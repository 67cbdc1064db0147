"""What one request may cost the server before it is refused: the body's size, read no further than the limit
(whether the client declared a Content-Length or streams it chunked), and the prompt's length in characters,
checked before any tokenizing (a tokenizer takes about 1.5 µs a character: a 20 MB prompt is 30 s of work).
"""
from __future__ import annotations

from typing import Any, Callable

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from draftsmith.serve.server.schemas import APIError, error_body

BODY_METHODS = ("POST", "PUT", "PATCH")


class BodyLimit:
    """ASGI middleware: a request body over `max_bytes` is answered with a 413 while it arrives, before any of
    it is read when its Content-Length says so, as soon as the running count passes the limit when it is sent
    chunked; nothing past the limit is kept. A body within the limit reaches the app in one piece.

    Starlette's RequestBodyLimitMiddleware (FastAPI's `max_body_size`) counts the same way, but answers a
    declared oversize in plain text, and every error of this server is an OpenAI error body."""

    def __init__(self, app: ASGIApp, *, max_bytes: int, refused: Callable[[str], None] = lambda path: None):
        self.app = app
        self.max_bytes = max_bytes
        self.refused = refused  # told the path of every refused request (the server counts them)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in BODY_METHODS:
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self.refuse(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away mid-body: nobody to answer
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                # The response goes out now; uvicorn then discards the rest of the body as it arrives (keeping
                # the connection, so that a client that sends its whole body before reading still reads the 413).
                await self.refuse(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        chunks.clear()
        delivered = False

        async def replay() -> Message:
            nonlocal delivered
            if delivered:  # after the body: disconnect notices
                return await receive()
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    async def refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.refused(scope["path"])
        megabytes = self.max_bytes / (1 << 20)
        message = (f"the request body is larger than this server accepts ({megabytes:g} MB); send a shorter "
                   f"prompt, or start the server with a higher serve.max_body_mb")
        await JSONResponse(error_body(message, code="request_too_large"), status_code=413)(scope, receive, send)


def longest_token_chars(tokenizer: Any) -> int:
    """An upper bound on the characters one token covers: the longest entry of the vocabulary (byte-level BPE
    writes one symbol per byte, SentencePiece one per character, so an entry is never shorter than its text)."""
    return max(len(token) for token in tokenizer.get_vocab())


def check_prompt_chars(chars: int, *, limit: int, why: str, param: str) -> None:
    """Refuse a prompt of more than `limit` characters before it is tokenized."""
    if chars > limit:
        raise APIError(400, f"the {param} has {chars:,} characters, more than this server tokenizes ({limit:,}: "
                       f"{why}); send a shorter prompt", param=param, code="context_length_exceeded")
