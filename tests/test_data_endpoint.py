"""`data build --server`: answers from an OpenAI-compatible server (here `draftsmith serve` on a tiny target,
loopback only) make the same dataset as an in-process build; failures are retried; another model is refused."""
from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path

import pytest

from draftsmith.data.build import build_dataset
from draftsmith.data.config import EndpointConfig
from draftsmith.data.endpoint import EndpointError, answer_from_choice
from draftsmith.data.generate import Answer
from draftsmith.serve.server.app import create_app
from draftsmith.serve.server.engine import Engine
from draftsmith.serve.core.target import load_target
from tests.data_fixtures import config_for, prompts, quiet, read  # noqa: F401  (prompts is a fixture)
from tests.server_fixtures import running_server
from tests.tiny_models import save_tiny_target


@pytest.fixture(scope="module")
def target(tiny_target_dir):
    return load_target(tiny_target_dir)


@pytest.fixture(scope="module")
def served(target):
    """draftsmith serve (plain decoding) of the tiny target under its default id, the short name of its folder."""
    with running_server(create_app(Engine(target, None))) as url:
        yield url


class Flaky:
    """ASGI middleware: answers some completion requests with a 500, or only after the client's timeout."""

    def __init__(self, app, *, fail_every: int = 3, stall_every: int = 5, stall_seconds: float = 3.0):
        self.app, self.fail_every, self.stall_every, self.stall_seconds = app, fail_every, stall_every, stall_seconds
        self.calls = 0
        self.failed = 0
        self.stalled = 0

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] == "/v1/completions":
            self.calls += 1
            if self.calls > 1 and self.calls % self.fail_every == 0:  # the first one is the identity probe
                self.failed += 1
                await send({"type": "http.response.start", "status": 500,
                            "headers": [(b"content-type", b"application/json")]})
                await send({"type": "http.response.body", "body": json.dumps({"error": {"message": "boom"}}).encode()})
                return
            if self.calls > 1 and self.calls % self.stall_every == 0:
                self.stalled += 1
                await asyncio.sleep(self.stall_seconds)  # the client has given up by now: a timeout
        await self.app(scope, receive, send)


def reversed_byte_tokenizer():
    """The tiny tokenizer with its 256 byte tokens numbered backwards: same vocabulary size, other ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from tests.tiny_models import SPECIALS

    vocab = {ch: 255 - i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab.update({tok: 256 + i for i, tok in enumerate(SPECIALS)})
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>")


def server_config(prompts, url, **kw):
    fast = EndpointConfig(url=url, concurrency=3, timeout=1.5, retries=4, backoff=0.01, max_backoff=0.05)
    return replace(config_for(prompts), server=replace(fast, **kw))


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_server_build_equals_in_process_build(tmp_path, target, prompts, served, temperature):
    local = build_dataset(target, replace(config_for(prompts), temperature=temperature, seed=5),
                          out_dir=tmp_path / "local", progress=False, log=quiet)
    config = replace(server_config(prompts, served), temperature=temperature, seed=5)
    remote = build_dataset(target, config, out_dir=tmp_path / "remote", progress=False, log=quiet)
    # equal token for token: the server sends back the ids it wrote; sampled answers use the same seeds
    assert read(tmp_path / "remote") == read(tmp_path / "local")
    assert (remote.rows, remote.loss_tokens) == (local.rows, local.loss_tokens)
    info = json.loads((tmp_path / "remote" / "build_info.json").read_text())
    assert info["generation"]["engine"]["kind"] == "server" and info["generation"]["engine"]["model"] == Path(target.name).name
    assert info["generation"]["sampling"]["temperature"] == temperature


def test_failing_and_stalling_server_still_yields_the_whole_dataset(tmp_path, target, prompts):
    flaky = Flaky(create_app(Engine(target, None), model_name=target.name))
    with running_server(flaky) as url:
        result = build_dataset(target, server_config(prompts, url), out_dir=tmp_path / "flaky", progress=False,
                               log=quiet)
    build_dataset(target, config_for(prompts), out_dir=tmp_path / "local", progress=False, log=quiet)
    assert flaky.failed >= 1 and flaky.stalled >= 1
    assert read(tmp_path / "flaky") == read(tmp_path / "local") and result.rows == 5
    info = json.loads((tmp_path / "flaky" / "build_info.json").read_text())
    assert info["generation"]["engine"]["retried_requests"] >= flaky.failed + flaky.stalled


def test_a_server_that_keeps_failing_stops_the_build_and_a_rerun_resumes(tmp_path, target, prompts):
    flaky = Flaky(create_app(Engine(target, None), model_name=target.name), fail_every=1)  # every request fails
    out = tmp_path / "ds"
    with running_server(flaky) as url:
        with pytest.raises(EndpointError, match="failed 3 times.*rerun to resume"):
            build_dataset(target, server_config(prompts, url, retries=2), out_dir=out, progress=False, log=quiet)
    assert not (out / "dataset_info.json").exists()
    with running_server(create_app(Engine(target, None), model_name=target.name)) as url:
        build_dataset(target, server_config(prompts, url), out_dir=out, progress=False, log=quiet)
    build_dataset(target, config_for(prompts), out_dir=tmp_path / "local", progress=False, log=quiet)
    assert read(out) == read(tmp_path / "local")


def test_resume_after_a_kill_mid_build(tmp_path, target, prompts, served):
    config = server_config(prompts, served)

    def kill(part: int) -> None:
        raise KeyboardInterrupt

    out = tmp_path / "ds"
    with pytest.raises(KeyboardInterrupt):
        build_dataset(target, config, out_dir=out, progress=False, log=quiet, on_batch=kill)
    result = build_dataset(target, config, out_dir=out, progress=False, log=quiet)
    assert (result.reused_rows, result.rows) == (2, 5)
    build_dataset(target, config_for(prompts), out_dir=tmp_path / "local", progress=False, log=quiet)
    assert read(out) == read(tmp_path / "local")


def test_a_server_of_another_model_is_refused(tmp_path, target, prompts, served):
    with running_server(create_app(Engine(target, None), model_name="someone/else")) as url:
        with pytest.raises(EndpointError, match=r"serves \['someone/else'\], which is not the target"):
            build_dataset(target, server_config(prompts, url), out_dir=tmp_path / "a", progress=False, log=quiet)
    with pytest.raises(EndpointError, match="does not serve data.server.model='x'"):
        build_dataset(target, server_config(prompts, served, model="x"), out_dir=tmp_path / "b", progress=False,
                      log=quiet)
    # the target's name, another tokenizer: the probe's token ids differ
    impostor = load_target(save_tiny_target(tmp_path / "other", "llama"))
    impostor.tokenizer = reversed_byte_tokenizer()
    with running_server(create_app(Engine(impostor, None), model_name=target.name)) as url:
        with pytest.raises(EndpointError, match="tokenizes a probe text differently"):
            build_dataset(target, server_config(prompts, url), out_dir=tmp_path / "c", progress=False, log=quiet)
    assert not list((tmp_path / "c").glob(".work/part-*.jsonl"))  # refused before any prompt was answered


def test_answer_from_choice_puts_back_a_dropped_eos():
    eos = [9, 7]
    assert answer_from_choice({"token_ids": [1, 2, 9, 3], "finish_reason": "stop"}, eos_token_ids=eos,
                              max_new_tokens=8) == Answer([1, 2, 9], True)
    assert answer_from_choice({"token_ids": [1, 2], "finish_reason": "stop", "stop_reason": 7}, eos_token_ids=eos,
                              max_new_tokens=8) == Answer([1, 2, 7], True)
    assert answer_from_choice({"token_ids": [1, 2], "finish_reason": "stop"}, eos_token_ids=eos,
                              max_new_tokens=8) == Answer([1, 2, 9], True)
    assert answer_from_choice({"token_ids": [1, 2], "finish_reason": "length"}, eos_token_ids=eos,
                              max_new_tokens=2) == Answer([1, 2], False)


def test_a_server_build_from_the_command_line_loads_no_weights(tmp_path, tiny_target_dir, target, prompts, served,
                                                              monkeypatch):
    import draftsmith.serve.core.target
    from draftsmith.cli import main

    loaded, real = [], draftsmith.serve.core.target.load_target

    def spy(*args, **kwargs):
        loaded.append(real(*args, **kwargs))
        return loaded[-1]

    monkeypatch.setattr(draftsmith.serve.core.target, "load_target", spy)
    out = tmp_path / "cli"
    assert main(["data", "build", "--target", str(tiny_target_dir), "--prompts", str(prompts), "--out", str(out),
                 "--server", served, "--no-progress", "data.max_new_tokens=6", "data.batch_size=2",
                 "data.max_length=256", "data.server.concurrency=2"]) == 0
    assert isinstance(loaded[0].model, draftsmith.serve.core.target.WeightlessModel)
    build_dataset(target, config_for(prompts), out_dir=tmp_path / "local", progress=False, log=quiet)
    assert read(out) == read(tmp_path / "local")
