"""The single-process parts of a split target: hidden states kept by hooks equal HF's tuple, the lock-step forward on
a one-process group, target-file fingerprints, and the errors of a launch that cannot start."""
from __future__ import annotations

import os
import shutil

import pytest
import torch

from draftsmith.serve.core.errors import DraftsmithError, TargetError
from draftsmith.serve.core.layers import FINAL, hidden_states_at, pick_hidden_states
from draftsmith.serve.core.target import load_configured, load_target
from draftsmith.serve.core.target_config import TargetConfig


@pytest.mark.parametrize("family", ["llama", "qwen3", "qwen3_moe"])
def test_hooked_hidden_states_equal_the_tuple(tiny_target_factory, family):
    target = load_target(tiny_target_factory(family, num_hidden_layers=4))
    decoder = target.model.get_decoder()
    input_ids = torch.randint(0, 256, (2, 9), generator=torch.Generator().manual_seed(0))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 6:] = 0
    layers = [0, 1, 2, 3, FINAL]
    with torch.no_grad():
        hooked = hidden_states_at(decoder, layers, input_ids=input_ids, attention_mask=attention_mask)
        out = decoder(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True, use_cache=False)
    for layer, states in pick_hidden_states(out.hidden_states, layers).items():
        assert torch.equal(hooked[layer], states), layer


def test_lock_step_forward_on_one_process(tiny_target_dir, monkeypatch):
    import torch.distributed as dist

    from draftsmith.data.capture import forward_hidden_states, forward_sharded, target_argmax
    from draftsmith.serve.core.parallel_layout import Layout
    from draftsmith.serve.core.sharded_target import ShardedForward

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29631")
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        target = load_target(tiny_target_dir)
        target.sharded = ShardedForward(target.model, Layout("fsdp", 1), rank=0, device=torch.device("cpu"),
                                        comm_device=torch.device("cpu"), top1=True)
        sequences = [[5, 6, 7, 8, 9], [1, 2, 3]]
        expected = forward_hidden_states(target, sequences, (1, FINAL))
        for (states, top1), reference in zip(forward_sharded(target, sequences, (1, FINAL)), expected):
            assert all(torch.equal(states[i], reference[i]) for i in (1, FINAL))
            assert torch.equal(top1, target_argmax(target.model.get_output_embeddings(), reference[FINAL]))
        target.sharded.drain()  # alone: returns at once
        with pytest.raises(ValueError, match="call drain"):
            target.sharded.forward(torch.zeros(0, 3, dtype=torch.long), torch.zeros(0, 3, dtype=torch.long), (1,))
    finally:
        dist.destroy_process_group()


def test_files_fingerprint_sees_other_weights(tiny_target_dir, tmp_path):
    from draftsmith.serve.core.identity import files_fingerprint

    copy = tmp_path / "copy"
    shutil.copytree(tiny_target_dir, copy)
    assert files_fingerprint(copy) == files_fingerprint(tiny_target_dir)
    weights = copy / "model.safetensors"
    blob = bytearray(weights.read_bytes())
    blob[-4:] = bytes(4)
    weights.write_bytes(bytes(blob))
    assert files_fingerprint(copy) != files_fingerprint(tiny_target_dir)


def test_a_launch_that_cannot_start_names_the_launch_command(monkeypatch):
    import torch.distributed as dist

    from draftsmith.serve.core.process_group import start

    assert not dist.is_initialized()
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    with pytest.raises(DraftsmithError, match=r"MASTER_ADDR.*torchrun --nproc-per-node N -m draftsmith.cli train"):
        start(device_type="cpu", command="train --config R.yaml")
    monkeypatch.setattr(dist, "is_gloo_available", lambda: False)
    with pytest.raises(DraftsmithError, match=r"gloo backend is not available.*torchrun"):
        start(device_type="cpu", command="data capture")
    monkeypatch.setattr(dist, "is_nccl_available", lambda: False)
    with pytest.raises(DraftsmithError, match=r"nccl backend is not available"):
        start(device_type="cuda", command="train")
    assert start.__module__ == "draftsmith.serve.core.process_group" and os.environ["WORLD_SIZE"] == "2"


def test_parallel_is_refused_where_the_target_runs_whole():
    with pytest.raises(TargetError, match="target.parallel=tp splits the target for `data capture` and `train`"):
        load_configured(TargetConfig(spec="demo", parallel="tp"))
    with pytest.raises(TargetError, match="parallel='pp'"):
        TargetConfig(parallel="pp").validate()
