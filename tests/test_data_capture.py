"""Hidden-state capture on tiny targets: content, manifest, resume, corruption, refusals, two processes."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import namedtuple
from pathlib import Path

import pytest
import torch

from draftsmith.data.build import build_dataset
from draftsmith.data.cache import MANIFEST, CacheError, bytes_per_token
from draftsmith.data.capture import CacheReader, capture_hidden_states, plan_batches
from draftsmith.data.config import CaptureConfig, DataBuildConfig
from draftsmith.data.layers import resolve_layers
from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.core.layers import FINAL
from draftsmith.serve.core.target import load_target
from draftsmith.serve.core.target_config import TargetConfig
from tests.data_fixtures import PROMPTS, quiet, write_jsonl

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def dataset_dir(tmp_path_factory, tiny_target):
    folder = tmp_path_factory.mktemp("capture-data")
    src = write_jsonl(folder / "p.jsonl", PROMPTS + [{"id": "f", "prompt": "Tell me more about it"}])
    config = DataBuildConfig(prompts=[str(src)], max_new_tokens=8, batch_size=3, max_length=256,
                             target=TargetConfig(device="cpu"))
    build_dataset(tiny_target, config, out_dir=folder / "ds", progress=False, log=quiet)
    return folder / "ds"


# The 2-layer tiny target is too shallow for EAGLE-3's distinct default layers (serve/core/layers.py); capture the
# ids its old default gave, a low/mid/high triple that repeats a layer (the cache stores each layer once).
LAYERS = "1,0,0"


def capture_config(**kw) -> CaptureConfig:
    base = dict(layers=LAYERS, storage_dtype="fp32", rows_per_shard=2, batch_tokens=64,
                target=TargetConfig(device="cpu"))
    base.update(kw)
    return CaptureConfig(**base)


def capture(target, dataset_dir, out, **kw):
    return capture_hidden_states(target, dataset_dir, out, capture_config(**kw), progress=False, log=quiet)


def shard_hashes(folder: Path) -> list[str]:
    return [s["sha256"] for s in json.loads((folder / MANIFEST).read_text())["shards"]]


def test_layer_sets():
    assert resolve_layers("eagle3", 30).stored == (1, 14, 26, FINAL)
    assert resolve_layers("eagle3", 30).aux_layer_ids == (1, 14, 26)
    assert resolve_layers("medusa", 30).stored == resolve_layers("eagle1", 30).stored == (FINAL,)
    assert resolve_layers("3, 7", 30).stored == (3, 7, FINAL)
    with pytest.raises(DraftsmithError, match=r"outside 0..29"):
        resolve_layers("30", 30)
    with pytest.raises(DraftsmithError, match="at least 4 layers"):
        resolve_layers("eagle3", 2)
    with pytest.raises(DraftsmithError, match="dflash, eagle1, eagle3, gemma4_assistant, medusa, mtp, peagle"):
        resolve_layers("eagle9", 30)


def test_plan_batches_respects_token_budget():
    lengths = [5, 30, 12, 12, 70, 3]
    batches = plan_batches(lengths, 40)
    assert sorted(i for b in batches for i in b) == list(range(6))
    assert all(len(b) * max(lengths[i] for i in b) <= 40 or len(b) == 1 for b in batches)
    assert batches[0] == [4]  # longest first, alone when over budget


def test_capture_content_matches_the_target(tmp_path, tiny_target, dataset_dir):
    import datasets

    result = capture(tiny_target, dataset_dir, tmp_path / "cache")
    reader = CacheReader(tmp_path / "cache")
    data = datasets.load_from_disk(str(dataset_dir))
    assert len(reader) == len(data) == result.rows == 6 and result.shards_written == 3
    assert reader.layer_ids == [0, 1, FINAL] and reader.aux_layer_ids == [1, 0, 0]
    manifest = reader.manifest
    assert manifest["target"]["config_hash"] == tiny_target.config_hash
    assert manifest["target"]["tokenizer_hash"] == tiny_target.tokenizer_hash
    assert "hidden_states[i+1]" in manifest["layers"]["convention"] and manifest["dtype"] == "fp32"
    assert [s["rows"] for s in manifest["shards"]] == [2, 2, 2]
    assert sum(s["tokens"] for s in manifest["shards"]) == manifest["tokens"] == sum(map(len, data["input_ids"]))
    assert all(len(s["sha256"]) == 64 for s in manifest["shards"])
    per_token = bytes_per_token(3, 32, "fp32")
    assert per_token * manifest["tokens"] <= manifest["bytes"] <= per_token * manifest["tokens"] + 3 * 4096
    reader.check_target(tiny_target)
    model = tiny_target.model
    for index in (0, 3, 5, -1):
        row = reader[index]
        expected = data[index]
        assert row["id"] == expected["id"] and row["domain"] == expected["domain"]
        assert row["input_ids"].tolist() == expected["input_ids"]
        assert row["loss_mask"].tolist() == expected["loss_mask"]
        with torch.no_grad():
            out = model(torch.tensor([expected["input_ids"]]), output_hidden_states=True)
        for layer in (0, 1):
            torch.testing.assert_close(row["hidden_states"][layer], out.hidden_states[layer + 1][0], atol=1e-5, rtol=1e-4)
        # FINAL is the normed state: the lm_head on it gives back the target's logits
        with torch.no_grad():
            logits = model.lm_head(row["hidden_states"][FINAL])
        torch.testing.assert_close(logits, out.logits[0], atol=1e-4, rtol=1e-4)
    assert reader.row_lengths() == [len(x) for x in data["input_ids"]]


def test_reader_works_with_a_distributed_sampler(tmp_path, tiny_target, dataset_dir):
    from torch.utils.data import DataLoader, DistributedSampler

    capture(tiny_target, dataset_dir, tmp_path / "cache", storage_dtype="bf16", layers="eagle1")
    reader = CacheReader(tmp_path / "cache")
    assert reader.dtype == torch.bfloat16 and reader.layer_ids == [FINAL]
    seen = []
    for rank in (0, 1):
        sampler = DistributedSampler(reader, num_replicas=2, rank=rank, shuffle=True, seed=0)
        loader = DataLoader(reader, batch_size=None, sampler=sampler, num_workers=0)
        for row in loader:
            assert row["hidden_states"][FINAL].dtype == torch.bfloat16
            assert row["hidden_states"][FINAL].shape == (row["input_ids"].shape[0], 32)
            seen.append(row["id"])
    assert sorted(seen) == sorted(r["id"] for r in reader)
    import pickle

    clone = pickle.loads(pickle.dumps(reader))  # what a spawned DataLoader worker receives
    assert torch.equal(clone[1]["hidden_states"][FINAL], reader[1]["hidden_states"][FINAL])


def test_resume_after_interruption_equals_uninterrupted(tmp_path, tiny_target, dataset_dir):
    capture(tiny_target, dataset_dir, tmp_path / "full")

    class Killed(Exception):
        pass

    def kill(index: int) -> None:
        raise Killed

    out = tmp_path / "resumed"
    with pytest.raises(Killed):
        capture_hidden_states(tiny_target, dataset_dir, out, capture_config(), progress=False, log=quiet, on_shard=kill)
    assert not (out / MANIFEST).exists()
    first = (out / "shard-00000.safetensors").stat().st_mtime_ns
    # what a kill in the middle of writing leaves: a partial temporary file, and a shard without its sidecar
    (out / ".shard-00001.safetensors.tmp").write_bytes(b"partial")
    (out / "shard-00002.safetensors").write_bytes(b"garbage")
    with pytest.raises(CacheError, match="no manifest.json"):
        CacheReader(out)
    result = capture(tiny_target, dataset_dir, out)
    assert (result.shards_reused, result.shards_written) == (1, 2)
    assert (out / "shard-00000.safetensors").stat().st_mtime_ns == first  # kept, not redone
    assert shard_hashes(out) == shard_hashes(tmp_path / "full")
    full, resumed = CacheReader(tmp_path / "full"), CacheReader(out)
    for a, b in zip(full, resumed):
        assert a["id"] == b["id"] and torch.equal(a["hidden_states"][FINAL], b["hidden_states"][FINAL])


def test_corrupt_shards_are_named(tmp_path, tiny_target, dataset_dir):
    out = tmp_path / "cache"
    capture(tiny_target, dataset_dir, out)
    shard1 = out / "shard-00001.safetensors"
    blob = bytearray(shard1.read_bytes())
    blob[-10] ^= 0xFF  # same size, wrong content
    shard1.write_bytes(bytes(blob))
    with pytest.raises(CacheError, match=r"shard-00001.safetensors is corrupt: its sha256"):
        CacheReader(out)
    CacheReader(out, verify=False)  # sizes still agree
    shard0 = out / "shard-00000.safetensors"
    shard0.write_bytes(shard0.read_bytes()[:-100])
    with pytest.raises(CacheError, match=r"shard-00000.safetensors is corrupt: .*truncated"):
        CacheReader(out, verify=False)
    result = capture(tiny_target, dataset_dir, out)  # a resumed capture redoes both
    assert (result.shards_reused, result.shards_written) == (1, 2)
    CacheReader(out)


def test_refusals(tmp_path, tiny_target, tiny_target_factory, dataset_dir, monkeypatch):
    out = tmp_path / "cache"
    capture(tiny_target, dataset_dir, out)
    with pytest.raises(CacheError, match="differs in layers.*refusing to mix"):
        capture(tiny_target, dataset_dir, out, layers="eagle1")
    with pytest.raises(CacheError, match="differs in dtype"):
        capture(tiny_target, dataset_dir, out, storage_dtype="bf16")
    deeper = load_target(tiny_target_factory("llama", num_hidden_layers=3))  # same tokenizer, same stored layers
    with pytest.raises(DraftsmithError, match="built for target .* but this run's target is .*allow-other-target"):
        capture(deeper, dataset_dir, out)
    with pytest.raises(CacheError, match="holds a capture .* made for target .* but this run's target .*cannot mix"):
        capture(deeper, dataset_dir, out, allow_other_target=True)
    with pytest.raises(CacheError, match="captured from .* not from target"):
        CacheReader(out).check_target(deeper)
    other = load_target(tiny_target_factory("qwen2"))
    if other.tokenizer_hash != tiny_target.tokenizer_hash:
        with pytest.raises(DraftsmithError, match="built for target .* token ids mean other text"):
            capture(other, dataset_dir, tmp_path / "other")
    with pytest.raises(DraftsmithError, match="not a dataset written by"):
        capture(tiny_target, tmp_path, tmp_path / "x")

    import draftsmith.data.capture as capture_mod

    Usage = namedtuple("Usage", "total used free")
    monkeypatch.setattr(capture_mod.shutil, "disk_usage", lambda path: Usage(1 << 30, 1 << 30, 1000))
    with pytest.raises(DraftsmithError, match=r"the cache needs ~.* GiB .* has 0.00 GiB free"):
        capture(tiny_target, dataset_dir, tmp_path / "small")
    assert not list((tmp_path / "small").glob("shard-*"))


@pytest.mark.distributed
def test_two_processes_equal_one(tmp_path, tiny_target, tiny_target_dir, dataset_dir):
    capture(tiny_target, dataset_dir, tmp_path / "one")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), TOKENIZERS_PARALLELISM="false")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m",
           "draftsmith.cli", "data", "capture", "--target", str(tiny_target_dir), "--dataset", str(dataset_dir),
           "--out", str(tmp_path / "two"), "--layers", LAYERS, "--dtype", "fp32", "--no-progress",
           "capture.rows_per_shard=2", "capture.batch_tokens=64", "capture.device=cpu"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "2 process(es)" in proc.stderr  # really two ranks, not two single-process captures
    sidecars = [json.loads((tmp_path / "two" / f"shard-0000{i}.json").read_text()) for i in range(3)]
    assert [s["written_by_rank"] for s in sidecars] == [0, 1, 0]
    one, two = CacheReader(tmp_path / "one"), CacheReader(tmp_path / "two")
    assert one.manifest["identity"] == two.manifest["identity"] and len(one) == len(two)
    assert [s["rows"] for s in two.manifest["shards"]] == [2, 2, 2]
    for a, b in zip(one, two):
        assert a["id"] == b["id"] and torch.equal(a["input_ids"], b["input_ids"])
        for layer in one.layer_ids:
            torch.testing.assert_close(a["hidden_states"][layer], b["hidden_states"][layer], atol=1e-5, rtol=1e-4)
