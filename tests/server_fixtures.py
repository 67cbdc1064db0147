"""A server for tests: uvicorn on a loopback port in a thread, a slow n-gram drafter, a streaming client (a helper
module: test modules import from here, never from each other)."""
from __future__ import annotations

import contextlib
import json
import socket
import threading
import time

import httpx
import uvicorn

from draftsmith.serve.methods.ngram.drafter import NgramDrafter

POISON = [7, 7, 7]  # a prompt starting with these token ids makes SlowNgram's drafts raise


@contextlib.contextmanager
def running_server(app):
    """uvicorn on a free 127.0.0.1 port in a thread; yields the base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(15)
        sock.close()


def eventually(condition, timeout: float = 5.0, every: float = 0.02) -> bool:
    """Poll `condition` until it holds or `timeout` seconds pass; its last value."""
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(every)
    return bool(condition())


class SlowNgram(NgramDrafter):
    """The n-gram drafter (K every cycle) that sleeps `delay` seconds per row and cycle, so long generations take a
    predictable time. With a `gate` it drafts only once the gate is open: requests sent meanwhile queue up and join
    the batch together. A row whose prompt starts with POISON raises when it drafts (a decoding step that fails)."""
    shared_state = ("gate",)  # every row's fork waits on the same gate

    def __init__(self, *, delay: float = 0.05, gate: threading.Event | None = None, **kwargs):
        super().__init__(**kwargs)
        self.delay, self.gate = delay, gate
        self.poisoned = False

    def begin(self, prompt_ids, next_tokens, hidden_states) -> None:
        super().begin(prompt_ids, next_tokens, hidden_states)
        self.poisoned = prompt_ids[: len(POISON)].tolist() == POISON

    def propose(self, k, **kwargs):
        if self.gate is not None:
            assert self.gate.wait(30), "the test never opened the gate"
        if self.poisoned:
            raise RuntimeError("poisoned draft")
        time.sleep(self.delay)
        return super().propose(k, **kwargs)


def stream_completion(base: str, body: dict, *, timeout: float = 60) -> tuple[str, dict | None, str | None]:
    """A streamed /v1/completions request: its text, the usage of its last choice chunk, and an error chunk's
    message (None without one)."""
    text, usage, error = [], None, None
    with httpx.stream("POST", f"{base}/v1/completions", json={**body, "stream": True}, timeout=timeout) as resp:
        assert resp.status_code == 200, resp.read()
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: "):])
            if "error" in chunk:
                error = chunk["error"]["message"]
                continue
            text += [c["text"] for c in chunk["choices"]]
            usage = chunk["usage"] or usage
    return "".join(text), usage, error


def run_threads(work, items) -> list[BaseException]:
    """work(item) on one thread per item; the errors they raised."""
    errors: list[BaseException] = []

    def guarded(item) -> None:
        try:
            work(item)
        except BaseException as err:  # reported in the main thread
            errors.append(err)

    threads = [threading.Thread(target=guarded, args=(item,)) for item in items]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return errors
