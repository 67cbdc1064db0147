"""Self-distillation through a serving engine: an OpenAI-compatible endpoint (vLLM, SGLang, `draftsmith serve`)
writes the answers instead of an in-process model (`data build --server URL`).

The build renders every prompt with the target's own template, exactly as in process, and sends its token ids
to /v1/completions with `return_token_ids` (vLLM >= 0.10.2, SGLang, draftsmith serve): the answers come back as
the exact ids the target wrote, so the rows and loss masks are the ones an in-process build writes.

Before any prompt is sent, the endpoint must prove it serves the target: its model id is the target's name (or
the one named in data.server.model), and a probe text tokenizes to the same ids there as with the target's
tokenizer; otherwise the build is refused. Requests run data.server.concurrency at a time; 429, 5xx, lost
connections and timeouts are retried with exponential back-off, data.server.retries times per request. Any
other error stops the build; the rows finished so far are saved, and rerunning the command resumes it.
"""
from __future__ import annotations

import os
import random
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, Callable

from draftsmith.data.config import EndpointConfig
from draftsmith.data.generate import Answer, Request, RequestQueue
from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.core.target import Target

# Unusual characters, digits, code and whitespace runs: two different tokenizers almost never agree on all of it.
PROBE_TEXT = "Probe: naïve café, 12345 + 0.75 → ∑x²; `def f(x): return x[::-1]`\n\t  «done» 日本語 🙂"
RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}


class EndpointError(DraftsmithError):
    """The serving endpoint cannot be used for this build (unreachable, another model, an error it returned)."""


class _Retryable(Exception):
    pass


class Endpoint:
    """A small JSON client of one OpenAI-compatible server, with retries and back-off; safe across threads."""

    def __init__(self, config: EndpointConfig, *, sleep: Callable[[float], None] = time.sleep):
        import httpx

        if not config.url:
            raise EndpointError("data.server.url is empty; pass --server URL (e.g. http://127.0.0.1:8000)")
        self.config = config
        self.url = config.url.rstrip("/")
        if self.url.endswith("/v1"):
            self.url = self.url[: -len("/v1")]
        headers = {}
        key = os.environ.get(config.api_key_env) if config.api_key_env else None
        if key:
            headers["Authorization"] = f"Bearer {key}"
        self.client = httpx.Client(timeout=config.timeout, headers=headers)
        self.sleep = sleep
        self.retried = 0  # requests sent again after a retryable failure (all threads)
        self._lock = threading.Lock()

    def close(self) -> None:
        self.client.close()

    def request(self, method: str, path: str, body: dict | None = None) -> dict:
        """The JSON answer of `method path`, retried on 429/5xx, lost connections and timeouts."""
        import httpx

        attempt = 0
        while True:
            try:
                response = self.client.request(method, f"{self.url}{path}", json=body)
                if response.status_code in RETRY_STATUS:
                    raise _Retryable(f"HTTP {response.status_code}: {_message(response)}")
                if response.status_code >= 400:
                    raise EndpointError(f"{self.url}{path} answered HTTP {response.status_code}: {_message(response)}")
                return response.json()
            except (httpx.TimeoutException, httpx.TransportError, _Retryable) as err:
                if attempt >= self.config.retries:
                    what = f"timed out after {self.config.timeout:g} s" if isinstance(err, httpx.TimeoutException) \
                        else str(err) or type(err).__name__
                    raise EndpointError(f"{self.url}{path} failed {attempt + 1} times (last: {what}); the rows "
                                        f"finished so far are saved: rerun to resume") from None
            delay = min(self.config.backoff * 2 ** attempt, self.config.max_backoff)
            self.sleep(delay * (0.5 + random.random() / 2))  # jitter: concurrent retries do not stampede
            attempt += 1
            with self._lock:
                self.retried += 1


def _message(response: Any) -> str:
    try:
        body = response.json()
        error = body.get("error", body) if isinstance(body, dict) else body
        text = error.get("message", error) if isinstance(error, dict) else error
        return str(text)[:300]
    except ValueError:
        return response.text[:300]


def check_identity(endpoint: Endpoint, target: Target) -> str:
    """The served model id to send, once the server proved it serves `target`; EndpointError otherwise."""
    served = [card.get("id") for card in endpoint.request("GET", "/v1/models").get("data", [])]
    wanted = endpoint.config.model
    if wanted is not None:
        if wanted not in served:
            raise EndpointError(f"{endpoint.url} does not serve data.server.model={wanted!r}; it serves {served}")
        model = wanted
    else:
        names = {target.name, Path(str(target.path)).name, str(getattr(target.config, "_name_or_path", "") or "")}
        names |= {n.rstrip("/").split("/")[-1] for n in list(names) if n}
        matching = [m for m in served if m in names or m.rstrip("/").split("/")[-1] in names]
        if len(matching) != 1:
            raise EndpointError(f"{endpoint.url} serves {served}, which is not the target {target.name!r}; point "
                                f"--server at the target's server, or set data.server.model=ID if it serves this "
                                f"target under another name (the tokenizer is checked either way)")
        model = matching[0]
    expected = list(target.tokenizer(PROBE_TEXT)["input_ids"])
    body = endpoint.request("POST", "/v1/completions", {"model": model, "prompt": PROBE_TEXT, "max_tokens": 1,
                                                        "temperature": 0.0, "return_token_ids": True})
    choice = (body.get("choices") or [{}])[0]
    got = choice.get("prompt_token_ids")
    if got is None:
        raise EndpointError(f"{endpoint.url} does not return token ids (`return_token_ids`, vLLM >= 0.10.2, SGLang, "
                            f"draftsmith serve): the build needs the exact ids the target wrote")
    if list(got) != expected:
        first = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
        raise EndpointError(f"{endpoint.url} ({model}) tokenizes a probe text differently from the target "
                            f"{target.name!r} (first difference at token {first}: {got[first:first + 3]} there, "
                            f"{expected[first:first + 3]} here): it serves another model or tokenizer")
    return model


class EndpointBatcher(RequestQueue):
    """Queued prompts answered by the server, `concurrency` requests in flight."""

    def __init__(self, endpoint: Endpoint, *, model: str, concurrency: int, max_new_tokens: int,
                 eos_token_ids: list[int], temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0):
        super().__init__()
        self.endpoint = endpoint
        self.model = model
        self.concurrency = concurrency
        self.max_new_tokens = max_new_tokens
        self.eos = list(eos_token_ids)
        self.sampling = {"temperature": temperature, "top_p": top_p, **({"top_k": top_k} if top_k > 0 else {})}
        self.pending: dict[Future, Request] = {}
        self.pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="draftsmith-endpoint")

    @property
    def running(self) -> int:
        return len(self.pending)

    def step(self) -> list[tuple[Request, Answer]]:
        """Send queued requests up to `concurrency` in flight; wait for at least one answer; return the answers."""
        while self.queue and len(self.pending) < self.concurrency:
            request = self.queue.popleft()
            self.pending[self.pool.submit(self._complete, request)] = request
        done, _ = wait(list(self.pending), return_when=FIRST_COMPLETED)
        answers = []
        try:
            for future in done:
                answers.append((self.pending.pop(future), future.result()))
        except BaseException:
            self.close()
            raise
        return answers

    def close(self) -> None:
        for future in self.pending:
            future.cancel()
        self.pool.shutdown(wait=False, cancel_futures=True)

    def _complete(self, request: Request) -> Answer:
        body = {"model": self.model, "prompt": list(request.prompt), "max_tokens": self.max_new_tokens,
                "return_token_ids": True, "stop_token_ids": self.eos, **self.sampling}
        if request.seed is not None:
            body["seed"] = request.seed
        choice = (self.endpoint.request("POST", "/v1/completions", body).get("choices") or [None])[0]
        if not choice or choice.get("token_ids") is None:
            raise EndpointError(f"{self.endpoint.url} answered without token ids; it must support `return_token_ids`")
        return answer_from_choice(choice, eos_token_ids=self.eos, max_new_tokens=self.max_new_tokens)


def answer_from_choice(choice: dict, *, eos_token_ids: list[int], max_new_tokens: int) -> Answer:
    """The answer in a completion choice: its ids up to and including the first EOS.

    Servers differ in whether the EOS that ended an answer is among its ids; when the answer stopped
    (finish_reason "stop") short of max_tokens without one, the token that stopped it is put back: the stop
    token id the server names (vLLM `stop_reason`, SGLang `matched_stop`), else the target's first EOS.
    """
    ids = [int(t) for t in choice["token_ids"]]
    eos = set(eos_token_ids)
    for i, token in enumerate(ids):
        if token in eos:
            return Answer(token_ids=ids[: i + 1], finished=True)
    if choice.get("finish_reason") == "stop" and len(ids) < max_new_tokens:
        stop = next((s for s in (choice.get("stop_reason"), choice.get("matched_stop")) if isinstance(s, int)), None)
        return Answer(token_ids=ids + [stop if stop is not None else eos_token_ids[0]], finished=True)
    return Answer(token_ids=ids, finished=False)
