"""The OpenAI-compatible server end to end: a real uvicorn server on a loopback port, a tiny target,
the n-gram drafter, the official `openai` client; bad inputs, concurrency and disconnects."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
import torch

from draftsmith.serve.decoding import speculative_generate
from draftsmith.serve.drafters import build_drafter
from draftsmith.serve.server.app import create_app
from draftsmith.serve.server.engine import Engine
from draftsmith.serve.core.target import load_target
from tests.server_fixtures import SlowNgram, eventually, run_threads, running_server
from tests.tiny_models import save_tiny_target

ROOT = Path(__file__).resolve().parents[1]
MODEL = "tiny"
K = 4


# K every cycle: these tests compare the server's answers, μ and seeded samples with the decoder's and across
# requests; a per-step length learns from every request (and times the drafter), so those would depend on the
# order requests came in
DRAFTER = "ngram:length=fixed"


@pytest.fixture(scope="module")
def target(tiny_target_dir):
    return load_target(tiny_target_dir)


@pytest.fixture(scope="module")
def url(target):
    app = create_app(Engine(target, build_drafter(DRAFTER, target), k=K), model_name=MODEL)
    with running_server(app) as base:
        yield base


@pytest.fixture(scope="module")
def client(url):
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=30)


def chat_ids(target, content: str) -> torch.Tensor:
    text = target.tokenizer.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                                tokenize=False)
    return torch.tensor([target.tokenizer(text, add_special_tokens=False)["input_ids"]])  # (1, T)


def direct(target, input_ids: torch.Tensor, max_tokens: int, **options):
    """What the decoder itself produces (greedy): the text the server must return, and its stats."""
    res = speculative_generate(target, build_drafter(DRAFTER, target), input_ids, max_new_tokens=max_tokens, k=K,
                               temperature=0.0, **options)
    return target.tokenizer.decode(res.output_ids, skip_special_tokens=True), res


def test_chat_greedy_equals_decoder(target, client):
    expected, res = direct(target, chat_ids(target, "abc abc abc abc"), 48)
    out = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "abc abc abc abc"}],
                                         max_tokens=48, temperature=0)
    assert out.choices[0].message.content == expected
    assert out.choices[0].message.role == "assistant"
    usage = out.usage
    assert usage.completion_tokens == len(res.output_ids)
    assert usage.prompt_tokens == chat_ids(target, "abc abc abc abc").shape[1]
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    extra = usage.model_extra
    assert extra["target_forwards"] == res.stats.target_forwards
    assert extra["accepted_tokens"] == sum(res.stats.accepted_per_cycle)
    assert extra["mu"] == pytest.approx(res.stats.mu, abs=1e-3) and extra["mu"] >= 1.0
    assert extra["drafter"] == "ngram" and extra["k"] == K
    assert extra["draft_seconds"] >= 0 and extra["verify_seconds"] > 0
    expected_reason = "length" if len(res.output_ids) == 48 else "stop"
    assert out.choices[0].finish_reason == expected_reason


def test_completion_and_streams_match_whole_responses(target, client):
    prompt = "xyz xyz xyz"
    ids = torch.tensor([target.tokenizer(prompt)["input_ids"]])
    expected, res = direct(target, ids, 32)
    out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=32, temperature=0)
    assert out.choices[0].text == expected
    assert out.usage.completion_tokens == len(res.output_ids)

    chunks = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=32, temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == expected
    assert chunks[-1].choices[0].finish_reason == out.choices[0].finish_reason

    whole = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=30,
                                           temperature=0)
    stream = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=30,
                                            temperature=0, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert chunks[-1].usage.model_extra["mu"] == whole.usage.model_extra["mu"]


def test_raw_sse_framing(url):
    body = {"model": MODEL, "prompt": "abab", "max_tokens": 8, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=30) as resp:
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in resp.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines)
    assert lines[-1] == "data: [DONE]"
    last = json.loads(lines[-2][len("data: "):])
    assert last["choices"][0]["finish_reason"] in ("stop", "length") and last["usage"]["mu"] >= 1.0


def test_stop_strings_are_trimmed(target, client):
    full = client.completions.create(model=MODEL, prompt="hello", max_tokens=40, temperature=0, extra_body={
        "ignore_eos": True}).choices[0].text
    assert len(full) > 12
    stop = full[8:10]
    cut = full[: full.find(stop)]
    out = client.completions.create(model=MODEL, prompt="hello", max_tokens=40, temperature=0, stop=[stop],
                                    extra_body={"ignore_eos": True})
    assert out.choices[0].text == cut and out.choices[0].finish_reason == "stop"
    assert out.usage.completion_tokens < 40  # the decoder stopped, not just the text
    chunks = client.completions.create(model=MODEL, prompt="hello", max_tokens=40, temperature=0, stop=stop,
                                       stream=True, extra_body={"ignore_eos": True})
    assert "".join(c.choices[0].text for c in chunks if c.choices) == cut


def test_concurrent_clients_get_their_own_outputs(target, url):
    prompts = [f"{w} {w} {w}" for w in ("alpha", "beta", "gamma", "delta")]
    expected = {p: direct(target, chat_ids(target, p), 24)[0] for p in prompts}
    results: dict[str, str] = {}

    def ask(prompt: str) -> None:
        c = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)
        for _ in range(2):  # several rounds so requests overlap in the queue
            out = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}],
                                            max_tokens=24, temperature=0, stream=prompt.startswith("b"))
            text = ("".join(ch.choices[0].delta.content or "" for ch in out if ch.choices)
                    if prompt.startswith("b") else out.choices[0].message.content)
            assert results.setdefault(prompt, text) == text

    errors = run_threads(ask, prompts)
    assert not errors, errors
    assert results == expected
    assert len(set(results.values())) > 1


def _error(resp: httpx.Response, status: int, code: str | None = None, param: str | None = None) -> dict:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if code is not None:
        assert err["code"] == code
    if param is not None:
        assert err["param"] == param
    return err


def test_bad_inputs_get_openai_errors_and_the_server_keeps_serving(url, client):
    post = lambda path, **kw: httpx.post(f"{url}{path}", timeout=30, **kw)  # noqa: E731
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    _error(post("/v1/chat/completions", content=b'{"model": "tiny", "messages": [',
                headers={"content-type": "application/json"}), 400)
    _error(post("/v1/completions", content=b"not json at all", headers={"content-type": "application/json"}), 400)
    _error(post("/v1/chat/completions", json={**chat, "model": "gpt-9"}), 404, code="model_not_found", param="model")
    _error(post("/v1/chat/completions", json={**chat, "max_tokens": -5}), 400, param="max_tokens")
    _error(post("/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": -1}), 400, param="max_tokens")
    _error(post("/v1/completions", json={"model": MODEL, "prompt": "x" * 600}), 400, code="context_length_exceeded")
    _error(post("/v1/completions", json={"model": MODEL, "prompt": "x" * 500, "max_tokens": 100}), 400,
           code="context_length_exceeded")
    _error(post("/v1/chat/completions", json={**chat, "messages": []}), 400, param="messages")
    _error(post("/v1/chat/completions", json={**chat, "n": 2}), 400, param="n")
    _error(post("/v1/chat/completions", json={**chat, "temperature": 7}), 400, param="temperature")
    _error(post("/v1/completions", json={"model": MODEL, "prompt": ["a", "b"]}), 400, param="prompt")
    _error(httpx.get(f"{url}/v1/nothing-here"), 404)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-9", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.BadRequestError, match="context length"):
        client.completions.create(model=MODEL, prompt="y" * 520, max_tokens=4)

    out = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "still there?"}],
                                         max_tokens=4, temperature=0)
    assert out.usage.completion_tokens >= 1
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL] and models[0].model_extra["drafter"] == "ngram"
    health = httpx.get(f"{url}/health").json()
    assert health["status"] == "ok" and health["running"] == 0
    metrics = httpx.get(f"{url}/metrics").text
    assert 'draftsmith_requests_total{drafter="ngram",endpoint="chat",status="rejected"}' in metrics
    assert 'draftsmith_requests_total{drafter="ngram",endpoint="chat",status="ok"}' in metrics
    for name in ("draftsmith_mu_bucket", "draftsmith_time_to_first_token_seconds_count",
                 "draftsmith_time_per_output_token_seconds_count", "draftsmith_completion_tokens_total",
                 "process_resident_memory_bytes"):
        assert name in metrics


def test_chat_on_a_target_without_template_is_a_400(tiny_target_factory, tmp_path):
    target = load_target(save_tiny_target(tmp_path / "plain", chat_template=None))
    app = create_app(Engine(target, None), model_name=MODEL)
    with running_server(app) as base:
        resp = httpx.post(f"{base}/v1/chat/completions", timeout=30,
                          json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        _error(resp, 400, code="chat_template_missing")
        out = httpx.post(f"{base}/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 4,
                                                         "temperature": 0}, timeout=30).json()
        assert out["usage"]["mu"] == 1.0 and out["usage"]["drafter"] == "none"  # speculation off: plain decoding


def test_disconnect_frees_the_slot(target):
    """A long generation (>= 400 / (K+1) cycles of 50 ms = 4 s) abandoned by its client stops at once."""
    engine = Engine(target, SlowNgram(), k=K)
    app = create_app(engine, model_name=MODEL)
    long_body = {"model": MODEL, "prompt": "abc", "max_tokens": 400, "temperature": 0, "ignore_eos": True}
    with running_server(app) as base:
        with httpx.stream("POST", f"{base}/v1/completions", json={**long_body, "stream": True}, timeout=30) as resp:
            for line in resp.iter_lines():
                if line.startswith("data: ") and json.loads(line[6:])["choices"][0]["text"]:
                    break  # got generated text: hang up mid-stream
        t0 = time.monotonic()
        out = httpx.post(f"{base}/v1/completions", json={**long_body, "max_tokens": 4}, timeout=30).json()
        assert out["usage"]["completion_tokens"] == 4
        assert time.monotonic() - t0 < 2.0
        assert eventually(lambda: engine.cancelled == 1)

        with pytest.raises(httpx.ReadTimeout):  # a non-streaming client that gives up
            httpx.post(f"{base}/v1/completions", json=long_body, timeout=httpx.Timeout(30, read=0.5))
        t0 = time.monotonic()
        out = httpx.post(f"{base}/v1/completions", json={**long_body, "max_tokens": 4}, timeout=30).json()
        assert out["usage"]["completion_tokens"] == 4
        assert time.monotonic() - t0 < 2.0
        # The worker clears its slot and the abandoned requests' coroutines count themselves just after the
        # response goes out: wait for that (bounded) rather than race it.
        assert eventually(lambda: engine.cancelled == 2 and engine.running == 0)
        cancelled = 'draftsmith_requests_total{drafter="ngram",endpoint="completions",status="cancelled"} 2.0'
        assert eventually(lambda: cancelled in httpx.get(f"{base}/metrics").text)


def test_loadtest_client_counts_tokens_and_latencies(url, tmp_path):
    from draftsmith.bench.loadtest import builtin_prompts, int_list, main, percentile, run_load

    assert percentile([3.0, 1.0, 2.0], 50) == 2.0 and percentile([1.0, 2.0], 99) == pytest.approx(1.99)
    (server,) = run_load({"tiny": url}, builtin_prompts(), clients=2, requests=4, max_tokens=8, temperature=0.0,
                         timeout=30, deadline=60, warmup=1)
    result, outcomes = server.summary(4, 60), server.outcomes
    assert result.failed == 0 and len(outcomes) == 4 and result.clients == 2
    assert result.completion_tokens == sum(o.completion_tokens for o in outcomes) > 0
    assert all(o.ttft is not None and o.ttft > 0 for o in outcomes)
    assert 0 < result.ttft_p50 <= result.latency_p50 <= result.latency_p99
    assert result.rss_mib_before > 0 and result.rss_mib_after > 0

    assert int_list("1,4,16") == [1, 4, 16] and int_list("8") == [8]
    report = tmp_path / "sweep.json"
    assert main(["--url", url, "--clients", "1,2", "--requests", "2", "--max-tokens", "4", "--json",
                 str(report)]) == 0
    runs = json.loads(report.read_text())["runs"]
    assert [run["clients"] for run in runs] == [1, 2]
    assert all(r["failed"] == 0 and r["latency_p99"] > 0 for run in runs for r in run["results"])
    with pytest.raises(SystemExit):
        main(["--url", url, "--clients", "1,x"])
    with pytest.raises(SystemExit, match="loopback"):
        run_load({"x": "http://example.com:80"}, builtin_prompts(), clients=1, requests=1, max_tokens=1,
                 temperature=0.0, timeout=1, deadline=1)


@pytest.mark.slow
def test_demo_target_chat_greedy_equals_decoder(demo_target_dir):
    target = load_target(demo_target_dir)
    app = create_app(Engine(target, build_drafter(DRAFTER, target), k=K), model_name=MODEL)
    question = "Repeat exactly: red, green, blue, red, green, blue."
    expected, res = direct(target, chat_ids(target, question), 16)
    with running_server(app) as base:
        c = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=120)
        out = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": question}],
                                        max_tokens=16, temperature=0)
    assert out.choices[0].message.content == expected and expected.strip()
    assert out.usage.model_extra["target_forwards"] == res.stats.target_forwards


def test_sampling_with_a_seed_is_reproducible_and_matches_the_decoder(target, client):
    ids = torch.tensor([target.tokenizer("seeded")["input_ids"]])
    res = speculative_generate(target, build_drafter(DRAFTER, target), ids, max_new_tokens=24, k=K, temperature=0.9,
                               top_p=0.95, seed=11)
    expected = target.tokenizer.decode(res.output_ids, skip_special_tokens=True)
    texts = [client.completions.create(model=MODEL, prompt="seeded", max_tokens=24, temperature=0.9, top_p=0.95,
                                       seed=11).choices[0].text for _ in range(2)]
    assert texts == [expected, expected]


def test_seeded_requests_give_plain_seeded_text_alone_and_concurrently(target):
    """With the default drafter (its length chosen per step, from timing) and a batch of 4, each seeded request's
    text is plain seeded decoding's, sent alone or beside the others (serve/core/noise.py)."""
    from draftsmith.serve.decoding import plain_generate

    prompts = [f"seeded {i} " + "abc " * i for i in range(6)]
    expected = {}
    for i, prompt in enumerate(prompts):
        ids = torch.tensor([target.tokenizer(prompt)["input_ids"]])
        out = plain_generate(target, ids, max_new_tokens=20, temperature=0.8, seed=100 + i).output_ids
        expected[i] = target.tokenizer.decode(out, skip_special_tokens=True)
    app = create_app(Engine(target, build_drafter("ngram", target), k=K, max_batch=4), model_name=MODEL)
    got: dict[int, list[str]] = {i: [] for i in expected}
    with running_server(app) as base:
        c = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=60)

        def ask(i: int) -> None:
            got[i].append(c.completions.create(model=MODEL, prompt=prompts[i], max_tokens=20, temperature=0.8,
                                               seed=100 + i).choices[0].text)

        ask(0)
        assert run_threads(ask, list(range(6)) * 2) == []
    assert all(texts == [expected[i]] * len(texts) for i, texts in got.items()), (got, expected)


def test_build_app_from_config(tiny_target_dir):
    from draftsmith.serve.core.config import load_config
    from draftsmith.serve.server import ServeConfig, build_app

    config = load_config(ServeConfig, overrides=[f"target={tiny_target_dir}", "drafter=ngram:max_n=2", "k=3",
                                                 "served_model_name=cfg", "tree.enabled=true", "context_length=64",
                                                 "max_batch=3"])
    with running_server(build_app(config)) as base:
        card = httpx.get(f"{base}/v1/models").json()["data"][0]
        assert (card["id"], card["max_model_len"], card["num_speculative_tokens"]) == ("cfg", 64, 3)
        assert httpx.get(f"{base}/health").json()["max_batch"] == 3
        out = httpx.post(f"{base}/v1/completions", json={"model": "cfg", "prompt": "abcabc", "max_tokens": 8},
                         timeout=30).json()
        assert out["usage"]["completion_tokens"] >= 1 and out["usage"]["k"] == 3
        resp = httpx.post(f"{base}/v1/completions", json={"model": "cfg", "prompt": "a" * 60, "max_tokens": 8})
        _error(resp, 400, code="context_length_exceeded")


def test_the_short_model_id_is_served_and_the_full_name_accepted(target, tiny_target_dir):
    """As vLLM's --served-model-name: one id listed and answered with; here the default is the target's folder name,
    and the target as given (its full path) is accepted too."""
    with running_server(create_app(Engine(target, None))) as base:
        card = httpx.get(f"{base}/v1/models").json()["data"]
        assert [(c["id"], c["root"]) for c in card] == [(tiny_target_dir.name, str(tiny_target_dir))]
        for name in (tiny_target_dir.name, str(tiny_target_dir)):
            out = httpx.post(f"{base}/v1/completions", json={"model": name, "prompt": "ab", "max_tokens": 2},
                             timeout=30)
            assert out.status_code == 200 and out.json()["model"] == tiny_target_dir.name
        resp = httpx.post(f"{base}/v1/completions", json={"model": "tiny-other", "prompt": "ab"}, timeout=30)
        assert _error(resp, 404, code="model_not_found")["message"].endswith(
            f"this server serves `{tiny_target_dir.name}` (see GET /v1/models)")


def test_a_busy_port_is_reported_before_the_model_loads(tmp_path):
    """One line, exit 2, and no model loaded: the target named does not even exist."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        run = subprocess.run([sys.executable, "-m", "draftsmith.cli", "serve", "--target", str(tmp_path / "absent"),
                              "--port", str(port)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr
    assert run.stderr.strip().splitlines() == [f"error: port {port} on 127.0.0.1 is already in use (another "
                                               f"server?); stop it, or pass --port with a free port (--port 0 picks "
                                               f"one)"]


def test_a_free_port_is_free_and_a_busy_one_is_refused():
    """free_port (the benchmarks' child servers) names a port bind_socket can take; taken, it is refused in one
    line."""
    from draftsmith.serve.server.bind import BindError, bind_socket, free_port

    port = free_port()
    sock = bind_socket("127.0.0.1", port)
    try:
        sock.listen()
        with pytest.raises(BindError, match=f"port {port} on 127.0.0.1 is already in use"):
            bind_socket("127.0.0.1", port)
    finally:
        sock.close()


def test_serves_a_drafter_folder_with_tree_drafting_losslessly(target, tiny_target_dir, tmp_path):
    """A (random) EAGLE-3 head folder served with dynamic trees: greedy text equals plain decoding's."""
    from draftsmith.serve.core.config import load_config
    from draftsmith.serve.decoding import plain_generate
    from draftsmith.serve.methods.eagle3.head import eagle3_config
    from draftsmith.serve.drafters.folder import build_head, save_drafter
    from draftsmith.serve.server import ServeConfig, build_app

    torch.manual_seed(0)
    head_config = eagle3_config(target, aux_layer_ids=[0, 1, 1])
    folder = save_drafter(build_head(head_config), head_config, tmp_path / "eagle3")
    ids = chat_ids(target, "tree tree tree")
    plain = plain_generate(target, ids, max_new_tokens=20, temperature=0.0)
    expected = target.tokenizer.decode(plain.output_ids, skip_special_tokens=True)
    config = load_config(ServeConfig, overrides=[f"target={tiny_target_dir}", f"drafter={folder}", "k=3",
                                                 f"served_model_name={MODEL}", "tree.enabled=true", "tree.depth=3",
                                                 "tree.top_k=2", "tree.total_tokens=6"])
    with running_server(build_app(config)) as base:
        out = httpx.post(f"{base}/v1/chat/completions", timeout=60, json={
            "model": MODEL, "messages": [{"role": "user", "content": "tree tree tree"}], "max_tokens": 20,
            "temperature": 0}).json()
    assert out["choices"][0]["message"]["content"] == expected
    assert out["usage"]["drafter"] == "eagle3" and out["usage"]["completion_tokens"] == len(plain.output_ids)
