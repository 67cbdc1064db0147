"""The HTTP routes: OpenAI chat and legacy completions (whole or streamed as server-sent events),
model list, health and Prometheus metrics, on top of one `Engine` (which decodes concurrent requests together,
up to `max_batch` of them; serve/server/engine.py).

Every error leaves as an OpenAI-style body `{"error": {"message", "type", "param", "code"}}`.
Streams end with `data: [DONE]`. A client that disconnects cancels its generation: streamed
responses are cancelled by Starlette when the client goes away (the generator's `finally` sets the
job's cancel flag); whole responses poll for the disconnect while they wait.

One request cannot stall the others: its body is bounded while it arrives, its prompt's length before it is
tokenized (serve.server.limits), and prompts are rendered and tokenized on a thread of their own, so the event
loop keeps answering /health and streaming other clients' tokens meanwhile.
"""
from __future__ import annotations

import asyncio
import copy
import functools
import json
import logging
import time
import uuid
from contextlib import asynccontextmanager
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any, AsyncIterator, Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from draftsmith.serve.server.config import ServeConfig
from draftsmith.serve.server.bodies import body_problem
from draftsmith.serve.server.engine import (Cancelled, Engine, Event, Failed, Finished, GenerationParams, Job, Started,
                                            Tokens, Unavailable)
from draftsmith.serve.server.limits import BodyLimit, check_prompt_chars, longest_token_chars
from draftsmith.serve.server.metrics import CONTENT_TYPE_LATEST, ServerMetrics
from draftsmith.serve.server.prompts import (check_token_ids, completion_prompt, encode_text_prompt, render_chat,
                                  resolve_max_tokens)
from draftsmith.serve.core.traffic import TrafficRecorder
from draftsmith.serve.server.schemas import (APIError, ChatCompletionRequest, CompletionRequest, ModelCard, ModelList,
                                  SamplingFields, Usage, error_body)
from draftsmith.serve.server.text import TextAssembler
from draftsmith.serve.core.target import text_config

DISCONNECT_POLL_SECONDS = 0.25


log = logging.getLogger("draftsmith.serve")


def _seconds(value: float | None, unit: str = "") -> str:
    return "-" if value is None else f"{value * 1000:.0f} ms{unit}"


class ClientGone(Exception):
    pass


@dataclass
class Timing:
    arrival: float
    started: float | None = None
    first_token: float | None = None
    last_token: float | None = None

    def tokens(self, at: float) -> None:
        if self.first_token is None:
            self.first_token = at
        self.last_token = at

    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.arrival

    def tpot(self, completion_tokens: int) -> float | None:
        if self.first_token is None or self.last_token is None or completion_tokens < 2:
            return None
        return (self.last_token - self.first_token) / (completion_tokens - 1)


@dataclass
class Call:
    """One accepted request on its way through the engine."""
    endpoint: str  # "chat" | "completions"
    body: SamplingFields
    prompt_ids: list[int]
    max_tokens: int
    job: Job
    assembler: TextAssembler
    timing: Timing
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))


def _endpoint(path: str) -> str:
    return {"/v1/chat/completions": "chat", "/v1/completions": "completions"}.get(path, path)


def _error_response(err: APIError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status_code, headers=err.headers)


def _validation_message(err: RequestValidationError) -> tuple[str, str | None]:
    first = err.errors()[0] if err.errors() else {}
    loc = [str(part) for part in first.get("loc", ()) if part != "body"]
    if first.get("type") == "json_invalid":
        return f"the request body is not valid JSON ({first.get('ctx', {}).get('error', 'decode error')})", None
    param = ".".join(loc) or None
    message = first.get("msg", "invalid request").removeprefix("Value error, ")
    return (f"{param}: {message}" if param else message), param


def failure_message(event: Failed) -> str:
    if event.bad_request:
        return str(event.error)
    return f"generation failed: {type(event.error).__name__}: {event.error}"


def short_model_name(target_name: str) -> str:
    """The id a server lists by default: the folder or hub repository name (`HuggingFaceTB/SmolLM2-135M-Instruct`
    -> `SmolLM2-135M-Instruct`, `/models/mine/` -> `mine`)."""
    return PurePath(target_name).name or target_name


class Server:
    """Holds what the routes share: engine, tokenizer copies, metrics, names and limits."""

    def __init__(self, engine: Engine, *, model_name: str | None = None, aliases: tuple[str, ...] = (),
                 context_length: int | None = None, recorder: TrafficRecorder | None = None,
                 max_prompt_chars: int | None = None):
        self.engine = engine
        self.recorder = recorder
        target = engine.target
        # As vLLM's --served-model-name: responses and /v1/models carry one id, requests may name any of these; the
        # target as given (`aliases`: the --target spec, e.g. `demo`; its path or hub id) stays accepted beside the
        # short default.
        self.model_name = model_name or short_model_name(str(target.name))
        self.model_names = {self.model_name, str(target.name), str(target.path), *aliases}
        self.root = str(target.name)
        # The worker thread uses target.tokenizer (stop strings), the event loop a copy (response text) and the
        # prompt thread another, since a Rust tokenizer borrowed from two threads at once can raise "Already
        # borrowed". One prompt thread: tokenizing is CPU-bound, the GIL is shared, and the worker needs the cores.
        self.tokenizer = copy.deepcopy(target.tokenizer)
        self.prompt_tokenizer = copy.deepcopy(target.tokenizer)
        self.prompt_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="draftsmith-prompts")
        config = text_config(target.model.config)
        self.vocab_size = int(config.vocab_size)
        self.context_length = int(context_length or config.max_position_embeddings)
        if max_prompt_chars is None:
            longest = longest_token_chars(target.tokenizer)
            self.max_prompt_chars = longest * self.context_length
            self.prompt_chars_why = (f"no longer prompt fits the {self.context_length:,}-token context, at most "
                                     f"{longest} characters a token; serve.max_prompt_chars sets the limit")
        else:
            self.max_prompt_chars = max_prompt_chars
            self.prompt_chars_why = "serve.max_prompt_chars"
        self.eos_token_ids = set(target.eos_token_ids)
        self.metrics = ServerMetrics(engine.drafter_name, batch=engine.batch_stats)
        self.created = int(time.time())

    # ---- request handling -------------------------------------------------------------------------
    def check_request(self, body: SamplingFields) -> None:
        if body.model not in self.model_names:
            raise APIError(404, f"The model `{body.model}` does not exist; this server serves "
                           f"`{self.model_name}` (see GET /v1/models)", param="model", code="model_not_found")
        if body.n != 1:
            raise APIError(400, f"n={body.n} is not supported; send n=1 (or several requests)", param="n")
        found = body.unsupported()
        if found is not None:
            name, lacking = found
            raise APIError(400, f"`{name}` is not supported by this server ({lacking}); send the request without it",
                           param=name)

    def check_prompt_chars(self, chars: int, param: str) -> None:
        check_prompt_chars(chars, limit=self.max_prompt_chars, why=self.prompt_chars_why, param=param)

    async def prompt_ids(self, build: Callable[..., list[int]], *args: Any) -> list[int]:
        """`build(tokenizer, *args)` on the prompt thread: templating and tokenizing a long prompt take long
        enough to stall every other client if they ran on the event loop."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.prompt_thread, functools.partial(build, self.prompt_tokenizer, *args))

    def start(self, endpoint: str, body: SamplingFields, prompt_ids: list[int], requested: int | None,
              arrival: float, param: str) -> Call:
        max_tokens = resolve_max_tokens(prompt_tokens=len(prompt_ids), requested=requested,
                                        context_length=self.context_length, param=param)
        params = GenerationParams(max_new_tokens=max_tokens, temperature=body.temperature, top_p=body.top_p,
                                  top_k=body.top_k, seed=body.seed, stop_strings=body.stop_strings,
                                  ignore_eos=body.ignore_eos)
        try:
            job = self.engine.submit(prompt_ids, params, asyncio.get_running_loop())
        except Unavailable as err:
            retry = self.engine.retry_after()
            why = "server overloaded: " if err.code == "queue_full" else ""
            raise APIError(503, f"{why}{err}; retry in {retry} s", type="server_error", code=err.code,
                           headers={"Retry-After": str(retry)}) from None
        return Call(endpoint=endpoint, body=body, prompt_ids=prompt_ids, max_tokens=max_tokens, job=job,
                    assembler=TextAssembler(self.tokenizer, body.stop_strings), timing=Timing(arrival))

    def finish_reason(self, call: Call, output_ids: list[int]) -> str:
        if call.assembler.stopped:
            return "stop"
        if output_ids and output_ids[-1] in self.eos_token_ids and not call.body.ignore_eos:
            return "stop"
        return "length" if len(output_ids) >= call.max_tokens else "stop"

    def usage(self, call: Call, result: Any) -> Usage:
        stats = result.stats
        completion = len(result.output_ids)
        return Usage(prompt_tokens=len(call.prompt_ids), completion_tokens=completion,
                     total_tokens=len(call.prompt_ids) + completion, mu=round(float(stats.mu), 4),
                     target_forwards=int(stats.target_forwards), accepted_tokens=int(sum(stats.accepted_per_cycle)),
                     cycles=int(stats.cycles), draft_seconds=round(float(stats.draft_seconds), 6),
                     verify_seconds=round(float(stats.verify_seconds), 6), drafter=self.engine.drafter_name,
                     k=self.engine.k if self.engine.speculation else 0)

    def record(self, call: Call, usage: Usage) -> None:
        t = call.timing
        self.metrics.finished(prompt_tokens=usage.prompt_tokens, completion_tokens=usage.completion_tokens,
                              target_forwards=usage.target_forwards, accepted_tokens=usage.accepted_tokens,
                              mu=usage.mu, ttft=t.ttft(), tpot=t.tpot(usage.completion_tokens),
                              queue_seconds=None if t.started is None else t.started - t.arrival)
        self.metrics.request(call.endpoint, "ok")
        log.info("%s %s: %d+%d tokens, mu %.2f, ttft %s, %s", call.endpoint, call.id[:8], usage.prompt_tokens,
                 usage.completion_tokens, usage.mu, _seconds(t.ttft()), _seconds(t.tpot(usage.completion_tokens),
                                                                               "/token"))

    def keep(self, call: Call, result: Any) -> None:
        """Hand the answered request to the traffic recorder (`serve --record`), if there is one."""
        if self.recorder is None:
            return
        body = call.body
        messages = prompt = None
        if isinstance(body, ChatCompletionRequest):
            messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        elif isinstance(body.prompt, str):
            prompt = body.prompt
        self.recorder.record(endpoint=call.endpoint, domain=str((body.metadata or {}).get("domain", "default")),
                             store=body.store is not False, prompt_token_ids=call.prompt_ids,
                             output_token_ids=[int(t) for t in result.output_ids],
                             finish_reason=self.finish_reason(call, result.output_ids),
                             sampling={"temperature": body.temperature, "top_p": body.top_p, "top_k": body.top_k,
                                       "seed": body.seed, "max_tokens": call.max_tokens,
                                       "stop": list(body.stop_strings)},
                             messages=messages, prompt=prompt, mu=round(float(result.stats.mu), 4))

    def handle(self, call: Call, event: Event) -> str:
        """Apply a progress event; returns the text that became safe to send."""
        if isinstance(event, Started):
            call.timing.started = event.time
        elif isinstance(event, Tokens):
            call.timing.tokens(event.time)
            return call.assembler.add(event.token_ids)
        return ""

    # ---- response bodies --------------------------------------------------------------------------
    def _envelope(self, call: Call, obj: str) -> dict[str, Any]:
        prefix = "chatcmpl" if call.endpoint == "chat" else "cmpl"
        return {"id": f"{prefix}-{call.id}", "object": obj, "created": call.created, "model": self.model_name}

    def whole_body(self, call: Call, result: Any, usage: Usage) -> dict[str, Any]:
        reason = self.finish_reason(call, result.output_ids)
        text = call.assembler.text
        if call.endpoint == "chat":
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": reason}
            body = self._envelope(call, "chat.completion")
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
            body = self._envelope(call, "text_completion")
        if call.body.return_token_ids:
            choice["prompt_token_ids"] = list(call.prompt_ids)
            choice["token_ids"] = [int(t) for t in result.output_ids]
        return {**body, "choices": [choice], "usage": usage.model_dump()}

    def chunk(self, call: Call, text: str | None, *, finish_reason: str | None = None, role: bool = False,
              usage: Usage | None = None, choices: bool = True) -> str:
        if call.endpoint == "chat":
            body = self._envelope(call, "chat.completion.chunk")
            delta: dict[str, Any] = {"role": "assistant"} if role else {}
            if text is not None:
                delta["content"] = text
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        else:
            body = self._envelope(call, "text_completion")
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
        body["choices"] = [choice] if choices else []
        body["usage"] = usage.model_dump() if usage is not None else None
        return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

    # ---- the two ways of answering ----------------------------------------------------------------
    async def whole(self, call: Call, request: Request) -> JSONResponse:
        getter: asyncio.Future | None = None
        done = False
        checked = time.perf_counter()
        try:
            while True:
                if getter is None:
                    getter = asyncio.ensure_future(call.job.events.get())
                ready, _ = await asyncio.wait({getter}, timeout=DISCONNECT_POLL_SECONDS)
                if time.perf_counter() - checked >= DISCONNECT_POLL_SECONDS:  # tokens may arrive steadily
                    checked = time.perf_counter()
                    if await request.is_disconnected():
                        raise ClientGone()
                if not ready:
                    continue
                event, getter = getter.result(), None
                self.handle(call, event)
                if isinstance(event, Finished):
                    call.assembler.finish()
                    usage = self.usage(call, event.result)
                    self.record(call, usage)
                    self.keep(call, event.result)
                    done = True
                    return JSONResponse(self.whole_body(call, event.result, usage))
                if isinstance(event, Failed):
                    done = True
                    if event.bad_request:
                        raise APIError(400, failure_message(event))  # the handler counts it as rejected
                    self.metrics.request(call.endpoint, "error")
                    raise APIError(500, failure_message(event), type="server_error")
                if isinstance(event, Cancelled):
                    done = True
                    self.metrics.request(call.endpoint, "cancelled")
                    raise APIError(503, event.message, type="server_error", code="shutting_down",
                                   headers={"Retry-After": str(self.engine.retry_after())})
        except ClientGone:
            return Response(status_code=499)  # nobody reads it; nginx's "client closed request"
        finally:
            if getter is not None:
                getter.cancel()
            if not done:
                self.engine.cancel(call.job)
                self.metrics.request(call.endpoint, "cancelled")

    async def stream(self, call: Call) -> AsyncIterator[str]:
        done = False
        try:
            if call.endpoint == "chat":
                yield self.chunk(call, "", role=True)
            while True:
                event = await call.job.events.get()
                delta = self.handle(call, event)
                if delta:
                    yield self.chunk(call, delta)
                if isinstance(event, Finished):
                    tail = call.assembler.finish()
                    if tail:
                        yield self.chunk(call, tail)
                    usage = self.usage(call, event.result)
                    self.record(call, usage)
                    self.keep(call, event.result)
                    done = True
                    reason = self.finish_reason(call, event.result.output_ids)
                    # μ per request rides on the last choice chunk; OpenAI's usage-only chunk follows on request.
                    yield self.chunk(call, None if call.endpoint == "chat" else "", finish_reason=reason,
                                     usage=usage)
                    if call.body.include_usage:
                        yield self.chunk(call, None, usage=usage, choices=False)
                    yield "data: [DONE]\n\n"
                    return
                if isinstance(event, (Failed, Cancelled)):
                    done = True
                    failed = isinstance(event, Failed)
                    bad = failed and event.bad_request
                    self.metrics.request(call.endpoint, "rejected" if bad else "error" if failed else "cancelled")
                    message = failure_message(event) if failed else event.message
                    kind = "invalid_request_error" if bad else "server_error"
                    code = None if failed else "shutting_down"
                    yield f"data: {json.dumps(error_body(message, type=kind, code=code))}\n\n"
                    yield "data: [DONE]\n\n"
                    return
        finally:
            if not done:  # the client went away (Starlette cancelled us) or the send failed
                self.engine.cancel(call.job)
                self.metrics.request(call.endpoint, "cancelled")

    async def answer(self, call: Call, request: Request) -> Response:
        if call.body.stream:
            return StreamingResponse(self.stream(call), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        return await self.whole(call, request)

    def model_card(self) -> ModelCard:
        return ModelCard(id=self.model_name, created=self.created, root=self.root, max_model_len=self.context_length,
                         drafter=self.engine.drafter_name, num_speculative_tokens=self.engine.k
                         if self.engine.speculation else 0)


def create_app(engine: Engine, *, model_name: str | None = None, aliases: tuple[str, ...] = (),
               context_length: int | None = None, recorder: TrafficRecorder | None = None,
               max_body_mb: float = ServeConfig.max_body_mb, max_prompt_chars: int | None = None) -> FastAPI:
    """The ASGI app; it starts the engine's worker on startup and stops it on shutdown. `model_name`: the id it
    serves (default: the target's short name); `aliases`: other names requests may give it (the target as given on
    the command line); `recorder` keeps every answered request (serve.core.traffic); the limits are ServeConfig's."""
    server = Server(engine, model_name=model_name, aliases=aliases, context_length=context_length,
                    recorder=recorder, max_prompt_chars=max_prompt_chars)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        engine.start()
        try:
            yield
        finally:
            server.prompt_thread.shutdown(wait=False, cancel_futures=True)
            engine.close()

    app = FastAPI(title="draftsmith", description="OpenAI-compatible server on a speculative decoder",
                  lifespan=lifespan)
    app.state.server = server
    app.add_middleware(BodyLimit, max_bytes=int(max_body_mb * (1 << 20)),
                       refused=lambda path: server.metrics.request(_endpoint(path), "rejected"))

    @app.exception_handler(APIError)
    async def api_error(request: Request, err: APIError) -> JSONResponse:
        if err.status_code < 500:
            server.metrics.request(_endpoint(request.url.path), "rejected")
        return _error_response(err)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, err: RequestValidationError) -> JSONResponse:
        problem = body_problem(err.errors(), content_type=request.headers.get("content-type"),
                               body=await request.body(), endpoint=_endpoint(request.url.path))
        message, param = problem if problem is not None else _validation_message(err)
        server.metrics.request(_endpoint(request.url.path), "rejected")
        return _error_response(APIError(400, message, param=param))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, err: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if err.status_code == 404 else "invalid_request_error"
        return JSONResponse(error_body(str(err.detail), type=kind), status_code=err.status_code)

    @app.exception_handler(Exception)
    async def server_error(request: Request, err: Exception) -> JSONResponse:
        return JSONResponse(error_body(f"internal error: {type(err).__name__}: {err}", type="server_error"),
                            status_code=500)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        arrival = time.perf_counter()
        server.check_request(body)
        server.check_prompt_chars(sum(len(m.text()) for m in body.messages), "messages")
        prompt_ids = await server.prompt_ids(render_chat, body.messages)
        call = server.start("chat", body, prompt_ids, body.requested_max_tokens, arrival, "messages")
        return await server.answer(call, request)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        arrival = time.perf_counter()
        server.check_request(body)
        prompt = completion_prompt(body)
        if isinstance(prompt, str):
            server.check_prompt_chars(len(prompt), "prompt")
            prompt_ids = await server.prompt_ids(encode_text_prompt, prompt)
        else:
            prompt_ids = check_token_ids(prompt, server.vocab_size)
        call = server.start("completions", body, prompt_ids, body.requested_max_tokens, arrival, "prompt")
        return await server.answer(call, request)

    @app.get("/v1/models")
    async def models() -> ModelList:
        return ModelList(data=[server.model_card()])

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": server.model_name, "drafter": engine.drafter_name,
                "speculation": engine.speculation, "running": engine.running, "max_batch": engine.max_batch,
                "waiting": engine.waiting, "completed": engine.completed, "cancelled": engine.cancelled,
                "failed": engine.failed}

    @app.get("/metrics")
    async def metrics() -> Response:
        payload = server.metrics.render(running=engine.running, waiting=engine.waiting)
        return Response(payload, media_type=CONTENT_TYPE_LATEST)

    return app
