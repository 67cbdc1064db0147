"""`data build --capture`: the cache written from the forwards that generate the answers equals a separate
`data capture` of the same dataset (within the precision's tolerance), resumes, and refuses bad input before any
work."""
from __future__ import annotations


import pytest
import torch

from draftsmith.data.build import build_dataset
from draftsmith.data.cache import CacheError
from draftsmith.data.capture import CacheReader, capture_hidden_states, forward_hidden_states
from draftsmith.data.config import CaptureConfig
from draftsmith.data.generate import ContinuousBatcher, Request
from draftsmith.data.recorded import SUFFIX
from draftsmith.serve.batch.decoder import BatchDecoder
from draftsmith.serve.batch.record import Recording, target_argmax
from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.core.files import DiskFullError
from draftsmith.serve.core.layers import FINAL
from draftsmith.serve.core.target import load_target
from draftsmith.serve.core.target_config import TargetConfig
from draftsmith.serve.decoding import plain_generate
from tests.data_fixtures import PROMPTS, config_for, quiet, write_jsonl

MORE = [{"id": f"m{i}", "domain": "code", "prompt": f"Write function number {i}."} for i in range(5)]


@pytest.fixture()
def prompts(tmp_path):
    return write_jsonl(tmp_path / "prompts.jsonl", PROMPTS + MORE)


def capture_config(**kw) -> CaptureConfig:
    base = dict(layers="1,0", storage_dtype="fp32", rows_per_shard=3, batch_tokens=64,
                target=TargetConfig(device="cpu"))
    return CaptureConfig(**{**base, **kw})


def build(target, prompts, out, cache, **kw):
    capture = capture_config(**kw.pop("capture", {}))
    return build_dataset(target, config_for(prompts, batch_size=3, max_new_tokens=10, **kw), out_dir=out,
                         progress=False, log=quiet, capture=capture, cache_dir=cache)


def assert_caches_close(a, b, *, atol=1e-5):
    ra, rb = CacheReader(a), CacheReader(b)
    assert ra.manifest["identity"] == rb.manifest["identity"] and len(ra) == len(rb)
    for i in range(len(ra)):
        x, y = ra[i], rb[i]
        assert x["id"] == y["id"] and torch.equal(x["input_ids"], y["input_ids"])
        assert torch.equal(x["loss_mask"], y["loss_mask"]) and torch.equal(x["target_top1"], y["target_top1"])
        for layer in ra.layer_ids:
            torch.testing.assert_close(x["hidden_states"][layer], y["hidden_states"][layer], atol=atol, rtol=1e-4)


@pytest.mark.parametrize("family", ["llama", "qwen3_5", "gemma4"])
def test_recorded_states_are_the_rows_states(family, tiny_target_factory):
    # a full-attention, a hybrid linear-attention and a sliding-window target: prompts of 2..80 tokens + answers
    target = load_target(tiny_target_factory(family))
    layers = (0, target.num_layers - 1, FINAL)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 256, (int(n),), generator=g).tolist() for n in torch.randint(2, 80, (6,), generator=g)]
    batcher = ContinuousBatcher(target, slots=3, max_new_tokens=20, record=Recording(layers, torch.float32))
    for i, prompt in enumerate(prompts):
        batcher.add(Request(key=i, prompt=prompt))
    answers = {}
    while batcher.busy:
        answers.update((request.key, answer) for request, answer in batcher.step())
    for i, prompt in enumerate(prompts):
        plain = plain_generate(target, torch.tensor([prompt]), max_new_tokens=20).output_ids
        assert answers[i].token_ids == plain  # recording changes no answer
        row = prompt + plain
        reference = forward_hidden_states(target, [row], layers)[0]
        recorded = answers[i].recorded
        assert recorded.top1.shape == (len(row),)  # the closing step read the last answer token too
        for layer in layers:
            torch.testing.assert_close(recorded.states[layer], reference[layer], atol=1e-5, rtol=1e-4)
        assert torch.equal(recorded.top1, target_argmax(target.model.get_output_embeddings(), reference[FINAL]))


def test_the_cache_equals_a_separate_capture(tmp_path, tiny_target, prompts):
    built = build(tiny_target, prompts, tmp_path / "ds", tmp_path / "cache")
    # every row's states came from the generating forwards: the multi-turn rows' from their last turn
    assert built.capture.tokens_recorded == built.capture.tokens_captured == built.tokens
    assert not list((tmp_path / "ds" / ".work").glob(f"*{SUFFIX}"))  # the cache holds them now
    capture_hidden_states(tiny_target, tmp_path / "ds", tmp_path / "separate", capture_config(), progress=False,
                          log=quiet)
    assert_caches_close(tmp_path / "cache", tmp_path / "separate")
    # in bf16 storage too (the states are rounded once, from the same compute dtype)
    build(tiny_target, prompts, tmp_path / "ds16", tmp_path / "cache16", capture={"storage_dtype": "bf16"})
    capture_hidden_states(tiny_target, tmp_path / "ds16", tmp_path / "separate16",
                          capture_config(storage_dtype="bf16"), progress=False, log=quiet)
    assert_caches_close(tmp_path / "cache16", tmp_path / "separate16", atol=2e-2)


def test_an_interrupted_build_resumes_and_a_part_without_states_is_forwarded(tmp_path, tiny_target, prompts):
    class Stop(Exception):
        pass

    def stop_after_first(part):
        raise Stop

    with pytest.raises(Stop):
        build_dataset(tiny_target, config_for(prompts, batch_size=3, max_new_tokens=10), out_dir=tmp_path / "ds",
                      progress=False, log=quiet, capture=capture_config(), cache_dir=tmp_path / "cache",
                      on_batch=stop_after_first)
    work = tmp_path / "ds" / ".work"
    assert len(list(work.glob("part-*.jsonl"))) == len(list(work.glob(f"part-*{SUFFIX}"))) == 1
    resumed = build(tiny_target, prompts, tmp_path / "ds", tmp_path / "cache")
    assert resumed.reused_rows == 3 and resumed.capture.tokens_recorded == resumed.tokens
    capture_hidden_states(tiny_target, tmp_path / "ds", tmp_path / "separate", capture_config(), progress=False,
                          log=quiet)
    assert_caches_close(tmp_path / "cache", tmp_path / "separate")


def test_a_missing_states_file_means_a_forward(tmp_path, tiny_target, prompts, monkeypatch):
    # a part whose states file is gone (a kill between its two writes, a build without --capture): its rows are
    # forwarded, and the cache is the same
    import draftsmith.data.capture_live as live

    class Fewer(live.RecordedStates):
        def __init__(self, work, origin):
            sorted(work.glob(f"part-*{SUFFIX}"))[0].unlink()
            super().__init__(work, origin)

    monkeypatch.setattr(live, "RecordedStates", Fewer)
    built = build(tiny_target, prompts, tmp_path / "ds", tmp_path / "cache")
    assert 0 < built.capture.tokens_recorded < built.capture.tokens_captured == built.tokens
    capture_hidden_states(tiny_target, tmp_path / "ds", tmp_path / "separate", capture_config(), progress=False,
                          log=quiet)
    assert_caches_close(tmp_path / "cache", tmp_path / "separate")


def test_bad_input_is_refused_before_any_work(tmp_path, tiny_target, tiny_target_factory, prompts):
    # layers the target does not have: one line, nothing written
    with pytest.raises(DraftsmithError, match=r"outside 0..1"):
        build(tiny_target, prompts, tmp_path / "ds", tmp_path / "cache", capture={"layers": "5"})
    with pytest.raises(DraftsmithError, match="at least 4 layers"):
        build(tiny_target, prompts, tmp_path / "ds", tmp_path / "cache", capture={"layers": "eagle3"})
    assert not (tmp_path / "ds").exists() and not (tmp_path / "cache").exists()
    # the cache inside the dataset folder, which a build replaces whole
    with pytest.raises(DraftsmithError, match="its own folder"):
        build(tiny_target, prompts, tmp_path / "ds", tmp_path / "ds" / "cache")
    # a folder holding another layer set's cache: refused before generating
    build(tiny_target, prompts, tmp_path / "ds", tmp_path / "cache")
    with pytest.raises(CacheError, match="differs in layers"):
        build(tiny_target, prompts, tmp_path / "other", tmp_path / "cache", capture={"layers": "0"})
    assert not (tmp_path / "other").exists()
    # a recorder cannot ride on a speculative decoder (its verify forwards read rejected drafts)
    from draftsmith.serve.drafters import build_drafter

    with pytest.raises(DraftsmithError, match="plainly only"):
        BatchDecoder(tiny_target, build_drafter("ngram", tiny_target), slots=2,
                     record=Recording((FINAL,), torch.float32))


def test_a_full_disk_keeps_the_finished_parts_and_the_rerun_resumes(tmp_path, tiny_target, prompts, monkeypatch):
    import errno

    import safetensors.torch

    real = safetensors.torch.save_file
    calls = {"n": 0}

    def fills_on_second(tensors, filename, metadata=None):
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(errno.ENOSPC, "No space left on device", filename)
        return real(tensors, filename, metadata=metadata)

    monkeypatch.setattr(safetensors.torch, "save_file", fills_on_second)
    with pytest.raises(DiskFullError, match="disk filled"):
        build(tiny_target, prompts, tmp_path / "ds", tmp_path / "cache")
    work = tmp_path / "ds" / ".work"
    assert len(list(work.glob("part-*.jsonl"))) == len(list(work.glob(f"part-*{SUFFIX}"))) == 1
    assert not [p for p in work.iterdir() if ".tmp" in p.name]  # nothing half-written left
    monkeypatch.setattr(safetensors.torch, "save_file", real)
    resumed = build(tiny_target, prompts, tmp_path / "ds", tmp_path / "cache")
    assert resumed.reused_rows == 3 and resumed.capture.tokens_recorded == resumed.tokens
