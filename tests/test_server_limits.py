"""What one client may send the server (a real uvicorn server, a tiny target, real HTTP clients): bounded bodies
and prompts, refused while they arrive and before tokenizing; /health answering while a long prompt is tokenized;
invalid Unicode, non-finite numbers and OpenAI fields the server cannot honour refused with a 400 naming them."""
from __future__ import annotations

import json
import socket
import threading
import time
from urllib.parse import urlsplit

import httpx
import openai
import pytest

from draftsmith.serve.server.app import Server, create_app
from draftsmith.serve.server.engine import Engine
from draftsmith.serve.core.target import load_target
from tests.server_fixtures import running_server

MODEL = "tiny"
LIMIT_MB = 1 / 16  # 64 KiB
LIMIT = int(LIMIT_MB * (1 << 20))
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0}


@pytest.fixture(scope="module")
def target(tiny_target_dir):
    return load_target(tiny_target_dir)


@pytest.fixture(scope="module")
def app(target):
    return create_app(Engine(target, None), model_name=MODEL, max_body_mb=LIMIT_MB)


@pytest.fixture(scope="module")
def url(app):
    with running_server(app) as base:
        yield base


def _error(resp: httpx.Response, status: int, *, param: str | None = None, code: str | None = None,
           match: str = "") -> str:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    if param is not None:
        assert err["param"] == param, err
    if code is not None:
        assert err["code"] == code, err
    assert match.lower() in err["message"].lower(), err["message"]
    return err["message"]


def _raw(url: str, head: bytes, chunks=(), timeout: float = 10.0) -> tuple[int, bytes]:
    """Send `head` then `chunks` on a plain socket, never ending the body; the status and body answered."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=timeout) as sock:
        sock.sendall(head)
        for chunk in chunks:
            sock.sendall(chunk)
        data = b""
        while b"\r\n\r\n" not in data:
            data += sock.recv(65536)
        header, _, body = data.partition(b"\r\n\r\n")
        length = int(next(line.split(b":")[1] for line in header.split(b"\r\n")
                          if line.lower().startswith(b"content-length")))
        while len(body) < length:
            body += sock.recv(65536)
    return int(header.split()[1]), body


def _rejected(url: str) -> float:
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith('draftsmith_requests_total{drafter="none",endpoint="completions",status="rejected"}'):
            return float(line.split()[-1])
    return 0.0


def test_a_large_body_is_refused_while_it_arrives(url):
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n")
    before = _rejected(url)
    piece = b"x" * 16384
    # chunked, twice the limit sent and the body never finished: the 413 comes back without waiting for the rest
    frame = lambda data: b"%x\r\n%s\r\n" % (len(data), data)  # noqa: E731 (one chunk)
    status, body = _raw(url, head, [frame(b'{"model": "tiny", "prompt": "')] + [frame(piece)] * 8)
    assert status == 413 and json.loads(body)["error"]["code"] == "request_too_large"
    assert "max_body_mb" in json.loads(body)["error"]["message"]
    # a declared Content-Length over the limit: refused before any of the body is sent
    status, body = _raw(url, b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                             b"Content-Length: 10000000000\r\n\r\n")
    assert status == 413 and json.loads(body)["error"]["code"] == "request_too_large"
    # an ordinary client that streams its whole (8 MB) body before reading the answer reads the 413 too
    resp = httpx.post(f"{url}/v1/completions", content=iter([piece] * 512), timeout=30,
                      headers={"content-type": "application/json"})
    _error(resp, 413, code="request_too_large")
    assert _rejected(url) == before + 2  # the one that sent to /v1/chat/completions counts there
    # a body just within the limit is read and answered
    resp = httpx.post(f"{url}/v1/completions", json={"model": MODEL, "prompt": "a" * (LIMIT - 100)}, timeout=30)
    _error(resp, 400, param="prompt", code="context_length_exceeded")
    assert httpx.get(f"{url}/health", timeout=5).json()["status"] == "ok"


def test_a_long_prompt_is_refused_before_it_is_tokenized(target, app, url, monkeypatch):
    server: Server = app.state.server
    longest = max(target.tokenizer.get_vocab(), key=len)  # "<|endoftext|>": one token of 13 characters
    assert server.max_prompt_chars == len(longest) * server.context_length  # no longer prompt could fit
    tokenized = []
    original = server.prompt_ids

    async def spy(build, *args):
        tokenized.append(build.__name__)
        return await original(build, *args)

    monkeypatch.setattr(server, "prompt_ids", spy)
    post = lambda path, body: httpx.post(f"{url}{path}", json=body, timeout=30)  # noqa: E731
    over = server.max_prompt_chars + 1
    message = _error(post("/v1/completions", {"model": MODEL, "prompt": "y" * over}), 400, param="prompt",
                     code="context_length_exceeded", match=f"{over:,} characters")
    assert "serve.max_prompt_chars" in message
    halves = [{"role": "user", "content": "z" * (over // 2)}, {"role": "assistant", "content": "z" * (over // 2 + 1)}]
    _error(post("/v1/chat/completions", {**CHAT, "messages": halves}), 400, param="messages",
           code="context_length_exceeded", match="characters")
    assert tokenized == []
    # the bound is tight: the longest token `context` times is exactly a full context, tokenized and then refused
    _error(post("/v1/completions", {"model": MODEL, "prompt": longest * server.context_length, "max_tokens": 1}), 400,
           code="context_length_exceeded", match=f"({server.context_length} in the prompt")
    assert tokenized == ["encode_text_prompt"]


def test_health_answers_while_a_long_prompt_is_tokenized(target):
    """Tokenizing runs on its own thread: /health keeps answering in milliseconds meanwhile."""
    app = create_app(Engine(target, None), model_name=MODEL, max_body_mb=8, max_prompt_chars=10**7)
    prompt = "abc " * 150_000  # 600k characters: about a second of tokenizing
    with running_server(app) as base:
        done = threading.Event()
        answer: list[httpx.Response] = []

        def send() -> None:
            answer.append(httpx.post(f"{base}/v1/completions", json={"model": MODEL, "prompt": prompt}, timeout=60))
            done.set()

        sender = threading.Thread(target=send)
        t0 = time.perf_counter()
        sender.start()
        latencies = []
        while not done.is_set():
            start = time.perf_counter()
            assert httpx.get(f"{base}/health", timeout=30).status_code == 200
            latencies.append(time.perf_counter() - start)
            time.sleep(0.01)
        took = time.perf_counter() - t0
        sender.join()
    _error(answer[0], 400, code="context_length_exceeded", match=f"({len(prompt)} in the prompt")
    assert took > 0.3 and len(latencies) >= 3, (took, latencies)  # the prompt did take a while to tokenize
    assert max(latencies) < took / 2, (took, latencies)  # on the event loop, /health would have waited it out


def test_invalid_text_and_numbers_are_400s_naming_the_field(url):
    post = lambda path, raw: httpx.post(f"{url}{path}", content=raw, timeout=30,  # noqa: E731
                                        headers={"content-type": "application/json"})
    chat = json.dumps(CHAT)
    _error(post("/v1/chat/completions", chat.replace('"hi"', '"hi \\ud800 there"')), 400,
           param="messages.0.content", match="lone UTF-16 surrogate (U+D800 at character 3)")
    _error(post("/v1/chat/completions", chat.replace('"hi"', '"\\udfff"')), 400, param="messages.0.content",
           match="surrogate")
    _error(post("/v1/completions", '{"model": "tiny", "prompt": ["ok \\udc00"]}'), 400, param="prompt",
           match="surrogate")
    _error(post("/v1/chat/completions", chat.replace('"tiny"', '"\\ud800"')), 400, param="model", match="surrogate")
    _error(post("/v1/completions", '{"model": "tiny", "prompt": "x", "stop": ["\\ud9ff"]}'), 400, param="stop",
           match="surrogate")
    # a surrogate pair is one valid character
    ok = post("/v1/chat/completions", chat.replace('"hi"', '"hi \\ud83d\\ude00"'))
    assert ok.status_code == 200, ok.text
    for field, value in (("temperature", "NaN"), ("temperature", "Infinity"), ("top_p", "-Infinity"),
                         ("presence_penalty", "NaN")):
        _error(post("/v1/chat/completions", chat[:-1] + f', "{field}": {value}}}'), 400, param=field,
               match="finite number")
    _error(post("/v1/completions", '{"model": "tiny", "prompt": "x", "seed": 18446744073709551616}'), 400,
           param="seed")
    for ids, bad in (([5, 1000000, 7], 1000000), ([[3, -1]], -1)):
        _error(post("/v1/completions", json.dumps({"model": MODEL, "prompt": ids})), 400, param="prompt",
               match=f"token id {bad} is out of range for a vocabulary of 259")


def test_fields_the_server_cannot_honour_are_refused_by_name(url):
    post = lambda path, body: httpx.post(f"{url}{path}", json=body, timeout=30)  # noqa: E731
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
    for extra, param, why in (({"logprobs": True}, "logprobs", "log-probabilities"),
                              ({"top_logprobs": 2}, "top_logprobs", "log-probabilities"),
                              ({"tools": [tool]}, "tools", "function calling"),
                              ({"tool_choice": "required"}, "tool_choice", "function calling"),
                              ({"response_format": {"type": "json_object"}}, "response_format", "structured output"),
                              ({"frequency_penalty": 0.5}, "frequency_penalty", "penalties"),
                              ({"logit_bias": {"5": 10}}, "logit_bias", "logit bias")):
        message = _error(post("/v1/chat/completions", {**CHAT, **extra}), 400, param=param,
                         match=f"`{param}` is not supported")
        assert why in message
    _error(post("/v1/completions", {"model": MODEL, "prompt": "x", "logprobs": 1}), 400, param="logprobs")
    _error(post("/v1/completions", {"model": MODEL, "prompt": "x", "best_of": 3}), 400, param="best_of")
    null = {**CHAT, "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None}]}
    _error(post("/v1/chat/completions", null), 400, param="messages.1.content", match="not null")
    calls = {**CHAT, "messages": [{"role": "assistant", "content": "", "tool_calls": [{"id": "1"}]}]}
    _error(post("/v1/chat/completions", calls), 400, param="messages.0.tool_calls", match="function calling")
    # the values that ask for nothing are accepted, as OpenAI clients send them
    quiet = {"logprobs": False, "tools": [], "tool_choice": "none", "presence_penalty": 0, "frequency_penalty": 0.0,
             "logit_bias": {}, "response_format": {"type": "text"}}
    assert post("/v1/chat/completions", {**CHAT, **quiet}).status_code == 200
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=30)
    with pytest.raises(openai.BadRequestError, match="logprobs"):
        client.chat.completions.create(model=MODEL, messages=CHAT["messages"], logprobs=True, top_logprobs=1)


@pytest.mark.parametrize("override, message", [("max_body_mb=0", "max_body_mb must be above 0"),
                                               ("max_body_mb=nan", "max_body_mb must be a finite number"),
                                               ("max_prompt_chars=0", "max_prompt_chars must be at least 1"),
                                               ("record_segment_mb=-1", "record_segment_mb must be above 0")])
def test_limits_are_checked_when_the_config_is_built(override, message):
    from draftsmith.serve.core.config import load_config
    from draftsmith.serve.core.errors import ConfigError
    from draftsmith.serve.server import ServeConfig

    with pytest.raises(ConfigError, match=message):
        load_config(ServeConfig, overrides=[override])
