"""The server decodes concurrent requests together (continuous batching): each request's greedy tokens are plain
decoding's of its prompt alone, while the requests share forwards; a client that goes away frees its slot, a
queue longer than the batch drains, a failing step fails only its batch, a prompt the decoder refuses only itself,
and /metrics reports the batch."""
from __future__ import annotations

import logging
import re
import threading

import httpx
import pytest
import torch

from draftsmith.serve.core.target import load_target
from draftsmith.serve.decoding import plain_generate
from draftsmith.serve.server.app import create_app
from draftsmith.serve.batch.costs import warm_sizes
from draftsmith.serve.server.engine import Engine
from tests.server_fixtures import POISON, SlowNgram, eventually, run_threads, running_server, stream_completion

MODEL = "tiny"
K = 4


@pytest.fixture(scope="module")
def target(tiny_target_dir):
    return load_target(tiny_target_dir)


def prompt_ids(target, text: str) -> list[int]:
    return target.tokenizer(text)["input_ids"]


def plain_ids(target, prompt: list[int], max_tokens: int, *, ignore_eos: bool = False) -> list[int]:
    """Plain greedy decoding of `prompt` alone: the tokens the server must return for it."""
    return plain_generate(target, torch.tensor([prompt]), max_new_tokens=max_tokens,
                          eos_token_ids=() if ignore_eos else None).output_ids


def decode(target, ids: list[int]) -> str:
    return target.tokenizer.decode(ids, skip_special_tokens=True)


def metric(text: str, name: str) -> float:
    """The value of `name{drafter=...}` in a /metrics page."""
    found = re.search(rf"^{name}{{[^}}]*}} (\S+)$", text, re.MULTILINE)
    assert found, f"{name} not in /metrics"
    return float(found.group(1))


def open_when(gate: threading.Event, condition) -> threading.Thread:
    """A thread that opens `gate` once `condition` holds (or after 10 s, so a failing test does not hang)."""
    def wait_and_open() -> None:
        eventually(condition, timeout=10)
        gate.set()

    opener = threading.Thread(target=wait_and_open)
    opener.start()
    return opener


def test_concurrent_streams_share_forwards_and_equal_plain_decoding(target):
    """Four streams held back until all are in: they decode as one batch, each returning exactly its prompt's plain
    greedy tokens (a fifth, whole request checks the ids themselves), in fewer forwards than their sum."""
    gate = threading.Event()
    engine = Engine(target, SlowNgram(delay=0, gate=gate), k=K, max_batch=8)
    texts = ["alpha alpha alpha", "beta beta", "gamma gamma gamma gamma", "delta", "abab abab"]
    prompts = {text: prompt_ids(target, text) for text in texts}
    expected = {text: plain_ids(target, prompts[text], 24) for text in texts}
    answers: dict[str, tuple] = {}

    def ask(text: str) -> None:
        body = {"model": MODEL, "prompt": prompts[text], "max_tokens": 24, "temperature": 0}
        if text == texts[-1]:
            out = httpx.post(f"{base}/v1/completions", json={**body, "return_token_ids": True}, timeout=60).json()
            answers[text] = (out["choices"][0]["token_ids"], out["usage"])
        else:
            answers[text] = stream_completion(base, body)

    with running_server(create_app(engine, model_name=MODEL)) as base:
        opener = open_when(gate, lambda: engine.running + engine.waiting == 5)
        try:
            errors = run_threads(ask, texts)
        finally:
            gate.set()
            opener.join()
        page = httpx.get(f"{base}/metrics").text
    assert not errors, errors
    usages = []
    for text in texts[:-1]:
        streamed, usage, error = answers[text]
        assert error is None and streamed == decode(target, expected[text]), text
        assert usage["completion_tokens"] == len(expected[text])
        usages.append(usage)
    ids, usage = answers[texts[-1]]
    assert ids == expected[texts[-1]]
    usages.append(usage)
    stats = engine.batch_stats()
    assert stats.mean_batch > 1 and stats.forwards < sum(u["target_forwards"] for u in usages)
    assert metric(page, "draftsmith_batch_size_mean") == pytest.approx(stats.mean_batch) and stats.mean_batch > 1
    assert metric(page, "draftsmith_batch_size") == 0 and metric(page, "draftsmith_batch_size_max") == 8
    assert metric(page, "draftsmith_batch_cycles_total") == stats.cycles > 0
    assert metric(page, "draftsmith_batch_rows_total") == stats.cycle_rows
    assert metric(page, "draftsmith_requests_running") == 0 and metric(page, "draftsmith_requests_waiting") == 0
    assert engine.completed == 5


def test_a_cancelled_stream_frees_its_slot_and_the_others_finish(target):
    """Two slots: a long stream abandoned mid-way leaves the batch at once (it had >= 300 / (K+1) cycles of 50 ms
    left), its neighbour's tokens are unchanged, and a third request gets the freed slot."""
    engine = Engine(target, SlowNgram(), k=K, max_batch=2)
    neighbour = prompt_ids(target, "xyz xyz")
    late = prompt_ids(target, "hello")
    answers: dict[str, tuple] = {}

    def neighbour_stream(_) -> None:
        answers["neighbour"] = stream_completion(base, {"model": MODEL, "prompt": neighbour, "max_tokens": 24,
                                                        "temperature": 0, "ignore_eos": True})

    with running_server(create_app(engine, model_name=MODEL)) as base:
        long_body = {"model": MODEL, "prompt": "abc", "max_tokens": 400, "temperature": 0, "ignore_eos": True,
                     "stream": True}
        with httpx.stream("POST", f"{base}/v1/completions", json=long_body, timeout=30) as resp:
            lines = resp.iter_lines()  # held: a dropped line iterator closes the connection
            for line in lines:
                if line.startswith("data: ") and '"text": ""' not in line:
                    break  # generated text arrived: the long request runs
            thread = threading.Thread(target=neighbour_stream, args=(None,))
            thread.start()
            assert eventually(lambda: engine.running == 2)
        assert eventually(lambda: engine.cancelled == 1, timeout=2.0)
        out = httpx.post(f"{base}/v1/completions", timeout=30, json={
            "model": MODEL, "prompt": late, "max_tokens": 6, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True}).json()
        thread.join(30)
        assert eventually(lambda: engine.running == 0)
    assert out["choices"][0]["token_ids"] == plain_ids(target, late, 6, ignore_eos=True)
    text, usage, error = answers["neighbour"]
    assert error is None and text == decode(target, plain_ids(target, neighbour, 24, ignore_eos=True))
    assert engine.completed == 2


def test_more_requests_than_slots_all_finish(target):
    """Sixteen requests of different lengths on four slots, all queued before the first drafts: each finishes
    with its own plain greedy tokens, slots refilling as rows end."""
    gate = threading.Event()
    engine = Engine(target, SlowNgram(delay=0, gate=gate), k=K, max_batch=4)
    jobs = [(prompt_ids(target, f"request {i} " * (1 + i % 3)), 4 + (5 * i) % 17) for i in range(16)]
    got: dict[int, list[int]] = {}

    def ask(i: int) -> None:
        prompt, max_tokens = jobs[i]
        resp = httpx.post(f"{base}/v1/completions", timeout=60, json={
            "model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "return_token_ids": True})
        assert resp.status_code == 200, resp.text
        got[i] = resp.json()["choices"][0]["token_ids"]

    with running_server(create_app(engine, model_name=MODEL)) as base:
        opener = open_when(gate, lambda: engine.running + engine.waiting == 16)
        try:
            errors = run_threads(ask, range(16))
        finally:
            gate.set()
            opener.join()
    assert not errors, errors
    assert got == {i: plain_ids(target, prompt, max_tokens) for i, (prompt, max_tokens) in enumerate(jobs)}
    stats = engine.batch_stats()
    assert engine.completed == 16 and 2 < stats.mean_batch <= 4


def test_a_failing_step_fails_its_batch_and_the_server_serves_on(target):
    """A row whose drafting raises fails the step: both requests in the batch get a 500 (the stream an error
    chunk), and the next request is answered with plain decoding's tokens."""
    engine = Engine(target, SlowNgram(delay=0.02), k=K, max_batch=4)
    answers: dict[str, tuple] = {}
    with running_server(create_app(engine, model_name=MODEL)) as base:
        body = {"model": MODEL, "prompt": "abc", "max_tokens": 200, "temperature": 0, "ignore_eos": True}
        with httpx.stream("POST", f"{base}/v1/completions", json={**body, "stream": True}, timeout=30) as resp:
            lines = resp.iter_lines()  # held: a dropped line iterator closes the connection
            for line in lines:
                if line.startswith("data: ") and '"text": ""' not in line:
                    break  # the innocent request runs
            poisoned = httpx.post(f"{base}/v1/completions", timeout=30, json={
                "model": MODEL, "prompt": POISON + [65, 66], "max_tokens": 8, "temperature": 0})
            answers["rest"] = tuple(lines)
        after = httpx.post(f"{base}/v1/completions", timeout=30, json={
            "model": MODEL, "prompt": prompt_ids(target, "after"), "max_tokens": 8, "temperature": 0,
            "return_token_ids": True})
        page = httpx.get(f"{base}/metrics").text
    assert poisoned.status_code == 500
    assert poisoned.json()["error"]["message"] == "generation failed: RuntimeError: poisoned draft"
    rest = [line for line in answers["rest"] if line]
    assert "poisoned draft" in rest[-2] and rest[-1] == "data: [DONE]"
    assert after.status_code == 200
    assert after.json()["choices"][0]["token_ids"] == plain_ids(target, prompt_ids(target, "after"), 8)
    assert engine.failed == 2 and engine.completed == 1
    assert 'draftsmith_requests_total{drafter="ngram",endpoint="completions",status="error"} 2.0' in page


def test_a_prompt_the_decoder_refuses_fails_alone_with_a_400(target):
    """A context length set past the target's: a longer prompt passes the server's check, the decoder refuses it
    (a 400 with its message, or an invalid-request error chunk) and the server answers the next request."""
    engine = Engine(target, None, max_batch=2)
    with running_server(create_app(engine, model_name=MODEL, context_length=4096)) as base:
        body = {"model": MODEL, "prompt": [65] * 600, "max_tokens": 4, "temperature": 0}
        refused = httpx.post(f"{base}/v1/completions", json=body, timeout=30)
        assert refused.status_code == 400
        assert "600-token prompt; the target holds 512 positions" in refused.json()["error"]["message"]
        text, usage, error = stream_completion(base, body)
        assert "512 positions" in error and usage is None
        ok = httpx.post(f"{base}/v1/completions", json={**body, "prompt": [65] * 10}, timeout=30)
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] >= 1
        page = httpx.get(f"{base}/metrics").text
    assert 'draftsmith_requests_total{drafter="none",endpoint="completions",status="rejected"} 2.0' in page
    assert engine.failed == 2 and engine.completed == 1


def test_the_engine_measures_the_batch_sizes_verify_costs_at_start(target, caplog):
    """With a drafter, the costs of every power-of-two batch up to max_batch are measured by the worker before it
    takes a request."""
    from draftsmith.serve.drafters import build_drafter

    assert [warm_sizes(n) for n in (1, 2, 3, 8, 9)] == [[1], [1, 2], [1, 2, 4], [1, 2, 4, 8], [1, 2, 4, 8, 16]]
    engine = Engine(target, build_drafter("ngram", target), k=K, max_batch=3)
    with caplog.at_level(logging.INFO, logger="draftsmith.serve"):
        engine.start()
        assert eventually(lambda: sorted(engine.decoder.costs.measured) == [1, 2, 4])
        assert eventually(lambda: "verify costs measured" in caplog.text)
    try:
        assert "measuring verify costs at batch sizes [1, 2, 4]" in caplog.text
    finally:
        engine.close()
    assert Engine(target, None).decoder.costs is None
