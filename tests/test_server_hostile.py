"""The server against clients and operators that do not play nicely: queued clients that hang up, a full queue,
SIGTERM with requests in flight, SIGKILL then a restart, one long request's cache, the target named as given, bodies
that are empty or not JSON. Each ends in a one-line error or a correct answer."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import urlsplit

import httpx
import pytest
import torch

from draftsmith.serve.core.target import load_target
from draftsmith.serve.server.app import create_app
from draftsmith.serve.server.engine import Engine
from draftsmith.serve.server.slot_memory import cache_bytes, release_slot_cache
from draftsmith.serve.server.waiting import QueueFull, ShuttingDown, WaitingQueue, retry_after_seconds
from tests.server_fixtures import SlowNgram, eventually, running_server

ROOT = Path(__file__).resolve().parents[1]
MODEL = "tiny"
LONG = {"model": MODEL, "prompt": "abc", "max_tokens": 400, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def target(tiny_target_dir):
    return load_target(tiny_target_dir)


def _error(resp: httpx.Response, status: int, *, code: str | None = None, match: str = "") -> dict:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert code is None or err["code"] == code, err
    assert match in err["message"], err["message"]
    return err


def send_and_hold(base: str, body: dict) -> socket.socket:
    """POST `body` to /v1/completions on a raw socket and return it unread: closing it is a client hanging up."""
    parts = urlsplit(base)
    data = json.dumps(body).encode()
    sock = socket.create_connection((parts.hostname, parts.port), timeout=10)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(data), data))
    return sock


def test_the_waiting_queue_counts_what_it_holds_and_the_retry_estimate():
    q = WaitingQueue(2)
    q.put("a")
    q.put("b")
    with pytest.raises(QueueFull, match="2 requests are already waiting"):
        q.put("c")
    assert q.drop("a") and not q.drop("a") and len(q) == 1
    q.put("c")  # the dropped one's place
    assert q.get(block=False) == "b" and q.close() == ["c"] and q.get(block=True) is None
    with pytest.raises(ShuttingDown):
        q.put("d")
    assert retry_after_seconds([], slots=4) == 1  # nothing measured yet
    assert retry_after_seconds([0.2, 0.3], slots=1) == 1  # at least a second
    assert retry_after_seconds([9.0, 11.0], slots=4) == 3  # one of 4 slots frees about every 2.5 s


def test_a_client_that_left_the_queue_frees_its_place_and_a_full_queue_says_when_to_retry(target):
    """One slot, held by a request whose drafts wait on a gate; three queued clients hang up: their places free at
    once, while the slot is still held, and three live clients take them; a fourth gets a 503 with Retry-After."""
    gate = threading.Event()
    engine = Engine(target, SlowNgram(delay=0.0, gate=gate), k=4, max_batch=1, max_queue=3)
    answers: list[httpx.Response] = []
    with running_server(create_app(engine, model_name=MODEL)) as base:
        post = lambda body: answers.append(httpx.post(f"{base}/v1/completions", json=body, timeout=60))  # noqa: E731
        threads = [threading.Thread(target=post, args=({**LONG, "max_tokens": 8},))]
        try:
            threads[0].start()
            assert eventually(lambda: engine.running == 1)
            gone = [send_and_hold(base, {**LONG, "stream": stream}) for stream in (False, True, False)]
            assert eventually(lambda: engine.waiting == 3)
            for sock in gone:
                sock.close()
            assert eventually(lambda: engine.waiting == 0 and engine.cancelled == 3, timeout=3)
            assert engine.running == 1 and engine.completed == 0  # the slot is still held: dropped, not admitted
            threads += [threading.Thread(target=post, args=({**LONG, "max_tokens": 4},)) for _ in range(3)]
            for t in threads[1:]:
                t.start()
            assert eventually(lambda: engine.waiting == 3)
            full = httpx.post(f"{base}/v1/completions", json=LONG, timeout=30)
            err = _error(full, 503, code="queue_full", match="3 requests are already waiting")
            retry = full.headers["retry-after"]
            assert int(retry) >= 1 and f"retry in {retry} s" in err["message"]
        finally:
            gate.set()
            for t in threads:
                t.join(60)
    assert [a.status_code for a in answers] == [200] * 4
    assert engine.completed == 4


def test_a_long_request_gives_its_slot_cache_back(target):
    """The cache grown for a long request is freed once the batch is empty; one within serve.keep_cache_mb is kept
    for the next request."""
    engine = Engine(target, None, max_batch=2, keep_cache_bytes=None)
    with running_server(create_app(engine, model_name=MODEL)) as base:
        short = {"model": MODEL, "prompt": "ab", "max_tokens": 8, "ignore_eos": True}
        assert httpx.post(f"{base}/v1/completions", json=short, timeout=30).status_code == 200
        small = cache_bytes(engine.decoder.cache)
        assert small > 0
        engine.keep_cache_bytes = 4 * small
        assert httpx.post(f"{base}/v1/completions", json={**short, "max_tokens": 300}, timeout=60).status_code == 200
        assert eventually(lambda: engine.released_bytes > 4 * small)  # 300 tokens a row: over 4x the 8-token cache
        assert engine.decoder.cache is None
        assert httpx.post(f"{base}/v1/completions", json=short, timeout=30).status_code == 200
        assert eventually(lambda: engine.running == 0) and cache_bytes(engine.decoder.cache) == small  # kept
        idle = SimpleNamespace(cache=engine.decoder.cache)  # a decoder with no request: its cache's size decides
    assert release_slot_cache(idle, keep_bytes=None) == 0 and idle.cache is not None  # None: kept whatever its size
    assert release_slot_cache(idle, keep_bytes=0) == small and idle.cache is None


def test_the_target_as_given_on_the_command_line_names_the_model(target, monkeypatch):
    """`--target demo` serves the demo target under its short name; requests naming `demo` are answered too."""
    import draftsmith.serve.core.target
    from draftsmith.serve.core.config import load_config
    from draftsmith.serve.server import ServeConfig, build_app

    # `demo` stands for tiny here
    monkeypatch.setattr(draftsmith.serve.core.target, "load_configured", lambda config: target)
    config = load_config(ServeConfig, overrides=["target=demo", "speculation=false", "served_model_name=mine"])
    with running_server(build_app(config)) as base:
        for name in ("mine", "demo"):
            out = httpx.post(f"{base}/v1/completions", json={"model": name, "prompt": "ab", "max_tokens": 2},
                             timeout=30)
            assert out.status_code == 200 and out.json()["model"] == "mine", out.text
        _error(httpx.post(f"{base}/v1/completions", json={"model": "demo2", "prompt": "ab"}, timeout=30), 404,
               code="model_not_found")


def test_an_empty_or_non_json_body_says_what_to_send(target):
    with running_server(create_app(Engine(target, None), model_name=MODEL)) as base:
        post = lambda path, raw, kind="application/json": httpx.post(  # noqa: E731
            f"{base}{path}", content=raw, timeout=30, headers={"content-type": kind} if kind else {})
        _error(post("/v1/chat/completions", b""), 400,
               match="the request body is empty: send a JSON object with `model` and `messages`")
        _error(post("/v1/completions", b"", None), 400, match="the request body is empty: send a JSON object with "
                                                            "`model` and `prompt`")
        body = json.dumps({"model": MODEL, "prompt": "x"}).encode()
        _error(post("/v1/completions", body, "text/plain"), 400,
               match="Content-Type must be application/json (got text/plain)")
        _error(post("/v1/completions", body, "application/x-www-form-urlencoded"), 400,
               match="Content-Type must be application/json")
        _error(post("/v1/chat/completions", b"[1, 2]"), 400, match="must be a JSON object with `model` and "
                                                                  "`messages`, got an array")
        _error(post("/v1/completions", b"{}"), 400, match="model: Field required")  # a field: named as before
        assert post("/v1/completions", body, "application/json; charset=utf-8").status_code == 200


@pytest.mark.parametrize("override, message", [("drain_seconds=-1", "drain_seconds must be at least 0"),
                                               ("keep_cache_mb=nan", "keep_cache_mb must be a finite number")])
def test_the_drain_limit_and_the_kept_cache_are_checked_when_the_config_is_built(override, message):
    from draftsmith.serve.core.config import load_config
    from draftsmith.serve.core.errors import ConfigError
    from draftsmith.serve.server import ServeConfig

    with pytest.raises(ConfigError, match=message):
        load_config(ServeConfig, overrides=[override])


# ---- a real `draftsmith serve` process -----------------------------------------------------------------------------
class Served:
    """`python -m tests.slow_serve ARGS` (draftsmith serve on a slow n-gram drafter), its stderr kept."""

    def __init__(self, *args: str):
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.slow_serve", "--served-model-name", MODEL, *args],
                                     cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self.base: str | None = None
        threading.Thread(target=self._read, daemon=True).start()
        assert eventually(lambda: self.base is not None or self.proc.poll() is not None, timeout=120), self.lines
        assert self.base is not None, "".join(self.lines)
        assert eventually(self._healthy, timeout=30), "".join(self.lines)

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.append(line)
            if line.startswith("serving on "):
                self.base = line.split()[2]

    def _healthy(self) -> bool:
        try:
            return httpx.get(f"{self.base}/health", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    def port(self) -> int:
        return int(urlsplit(self.base).port)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)


def stream_events(base: str, body: dict, into: list) -> None:
    """A streamed /v1/completions request: every `data:` payload, parsed (`[DONE]` kept as is), into `into`."""
    with httpx.stream("POST", f"{base}/v1/completions", json={**body, "stream": True}, timeout=60) as resp:
        assert resp.status_code == 200, resp.read()
        for line in resp.iter_lines():
            if line.startswith("data: "):
                into.append(line[6:] if line == "data: [DONE]" else json.loads(line[6:]))


def test_sigterm_drains_within_its_limit_then_cancels_with_an_error(tiny_target_dir):
    """Two slots: a short request in flight at SIGTERM finishes; a long stream, and a request queued behind the two,
    are cancelled at the 2 s limit, each told why (an error event then [DONE], a 503 with Retry-After), and the
    process ends soon after."""
    served = Served("--target", str(tiny_target_dir), "--port", "0", "--max-batch", "2", "drain_seconds=2")
    base, events, answers = served.base, [], {}
    try:
        post = lambda name, body: answers.__setitem__(name, httpx.post(  # noqa: E731
            f"{base}/v1/completions", json=body, timeout=60))
        threads = [threading.Thread(target=stream_events, args=(base, LONG, events))]
        threads[0].start()
        assert eventually(lambda: any(isinstance(e, dict) and e["choices"][0]["text"] for e in events), timeout=30)
        threads.append(threading.Thread(target=post, args=("short", {**LONG, "max_tokens": 20})))
        threads[-1].start()
        assert eventually(lambda: httpx.get(f"{base}/health").json()["running"] == 2, timeout=30)
        threads.append(threading.Thread(target=post, args=("queued", LONG)))
        threads[-1].start()
        assert eventually(lambda: httpx.get(f"{base}/health").json()["waiting"] == 1, timeout=30)
        t0 = time.monotonic()
        served.proc.send_signal(signal.SIGTERM)
        served.proc.wait(30)
        took = time.monotonic() - t0
        for t in threads:
            t.join(30)
    finally:
        served.stop()
    assert 1.5 < took < 8, (took, "".join(served.lines))
    assert served.proc.returncode in (0, -signal.SIGTERM), "".join(served.lines)
    assert answers["short"].status_code == 200 and answers["short"].json()["usage"]["completion_tokens"] == 20
    err = _error(answers["queued"], 503, code="shutting_down", match="drain limit (2 s, serve.drain_seconds)")
    assert int(answers["queued"].headers["retry-after"]) >= 1 and err["type"] == "server_error"
    assert events[-1] == "[DONE]" and "drain limit" in events[-2]["error"]["message"], events[-3:]
    assert "cancelling the requests left" in "".join(served.lines)


def test_a_server_killed_mid_request_restarts_and_serves(tiny_target_dir, tmp_path):
    """SIGKILL while a stream runs (and the traffic recorder holds an open folder): the same command on the same
    port starts, answers, and records after what the first process recorded; nothing left behind blocks it."""
    record = tmp_path / "traffic"
    args = ("--target", str(tiny_target_dir), "--record", str(record))
    short = {**LONG, "max_tokens": 6}
    served = Served(*args, "--port", "0")
    try:
        assert httpx.post(f"{served.base}/v1/completions", json=short, timeout=60).status_code == 200
        events: list = []
        broken: list[Exception] = []

        def stream_until_killed() -> None:
            try:
                stream_events(served.base, LONG, events)
            except httpx.TransportError as err:  # the process died mid-stream
                broken.append(err)

        reader = threading.Thread(target=stream_until_killed)
        reader.start()
        assert eventually(lambda: len(events) > 2, timeout=30)
        served.proc.kill()
        served.proc.wait(30)
        reader.join(30)
        assert broken and events[-1] != "[DONE]"
    finally:
        served.stop()
    again = Served(*args, "--port", str(served.port()))
    try:
        out = httpx.post(f"{again.base}/v1/completions", json=short, timeout=60)
        assert out.status_code == 200 and out.json()["usage"]["completion_tokens"] == 6
    finally:
        again.stop()
    from draftsmith.serve.core.traffic import read_traffic

    assert len(list(read_traffic(record))) == 2  # the killed stream was never answered, so never kept


def test_a_cpu_slot_cache_takes_memory_only_for_what_is_written():
    """A slot cache is reserved for whole requests (prompt + max_tokens); on the CPU its pages are taken as written."""
    from draftsmith.serve.core.slots import reserve_zeros

    def rss_mib() -> float:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024

    like = torch.zeros(1, dtype=torch.bfloat16)
    before = rss_mib()
    cache = reserve_zeros((8, 4, 1 << 15, 256), like)  # 512 MiB reserved
    assert cache.shape == (8, 4, 1 << 15, 256) and cache.dtype == torch.bfloat16
    assert rss_mib() - before < 64
    cache[0, :, :16] = 1.0  # one row's first 16 columns: a few pages
    assert rss_mib() - before < 64
    assert float(cache[0, :, :17].float().sum()) == 4 * 16 * 256 and not cache[7, :, -16:].any()
