"""Offline (capture cache) and online (the target inside the step) training see the same features: the same
loss on the same batch, and the same trained weights."""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from draftsmith.serve.core.config import load_config
from draftsmith.serve.core.target import load_target
from tests.train_fixtures import EAGLE3_LAYERS, greedy_rows, save_rows, sharp_target
from draftsmith.train.config import TrainConfig
from draftsmith.train.run import train_drafter


@pytest.fixture(scope="module")
def cached(tmp_path_factory):
    from draftsmith.data.capture import capture_hidden_states
    from draftsmith.data.config import CaptureConfig

    root = tmp_path_factory.mktemp("offline")
    target_dir = sharp_target(root / "target", num_hidden_layers=EAGLE3_LAYERS)
    dataset = save_rows(greedy_rows(target_dir, rows=8, new_tokens=16), root / "data")
    target = load_target(target_dir)
    capture_hidden_states(target, dataset, root / "cache", CaptureConfig(layers="eagle3", storage_dtype="fp32"),
                          progress=False, log=lambda *_: None)
    return target_dir, dataset, root


def _config(target, dataset, root, method: str, mode: str) -> TrainConfig:
    return load_config(TrainConfig, overrides=[
        f"target={target}", f"data.dataset={dataset}", f"data.cache={root / 'cache'}", f"data.mode={mode}",
        f"out_dir={root / (method + '-' + mode)}", f"model.method={method}", "model.ttt_steps=2",
        "model.num_speculative_tokens=2", "optim.batch_size=2", "optim.max_steps=3", "optim.lr=3e-3",
        "data.eval_rows=2", "tracking=none", "log.progress=false", "checkpoint.every=0",
        *(["model.block_size=3"] if method == "dflash" else [])])


@pytest.mark.parametrize("method", ["eagle3", "eagle1", "medusa", "dflash", "peagle"])
def test_offline_and_online_give_the_same_loss_on_the_same_batch(cached, method):
    from draftsmith.train.features import open_rows
    from draftsmith.serve.methods.objective import TargetParts
    from draftsmith.train.objectives import build_objective
    from draftsmith.train.run import _batch_maker, head_config, needed_layers

    target_dir, dataset, root = cached
    target = load_target(target_dir)
    config = _config(target_dir, dataset, root, method, "online")
    cfg = head_config(config, target)
    layers = needed_layers(cfg)
    online_rows = open_rows("online", dataset=str(dataset))
    offline_rows = open_rows("offline", cache=str(root / "cache"), target=target, layers=layers)
    assert len(online_rows) == len(offline_rows) == 8
    from draftsmith.serve.drafters.folder import build_head

    torch.manual_seed(0)
    objective = build_objective(build_head(cfg), TargetParts.of(target), ttt_steps=2, decay=0.8, feature_noise=0.1,
                                feature_weight=1.0, ce_weight=0.1)
    seeds = torch.tensor([11, 12])
    results = []
    for rows, online in ((online_rows, True), (offline_rows, False)):
        batch, seconds = _batch_maker(config, target, layers, "cpu", online=online)([rows[0], rows[3]])
        assert (seconds > 0) == online  # only online mode runs the target
        sums = objective(batch.input_ids, batch.loss_mask, batch.hidden_states, batch.attention_mask, seeds)
        results.append((sums, objective.term_counts(batch)))
    (on, on_counts), (off, off_counts) = results
    assert on.keys() == off.keys() and on_counts.keys() == off_counts.keys()
    for name in on:
        assert torch.allclose(on[name], off[name], rtol=1e-5, atol=1e-5), name
        assert float(on_counts[name]) == float(off_counts[name]) > 0


def test_offline_training_matches_online_training(cached):
    target_dir, dataset, root = cached
    online = train_drafter(_config(target_dir, dataset, root, "eagle3", "online"))
    offline = train_drafter(_config(target_dir, dataset, root, "eagle3", "offline"))
    a, b = load_file(str(online / "model.safetensors")), load_file(str(offline / "model.safetensors"))
    for name in a:
        assert torch.allclose(a[name].float(), b[name].float(), atol=1e-5), name


def test_training_from_a_stale_cache_is_refused(cached, tmp_path, capsys):
    """`data build` adds rows to a dataset (a rerun with more prompts): a cache captured before no longer holds
    it, and training from it is refused with both digests and the command that refreshes it, which works."""
    import re
    import shlex
    import shutil

    from datasets import load_from_disk

    from draftsmith.data.capture import capture_hidden_states
    from draftsmith.data.config import CaptureConfig
    from draftsmith.cli import main

    target_dir, dataset, _ = cached
    rows = list(load_from_disk(str(dataset)))
    data = save_rows(rows[:6], tmp_path / "data")
    capture_hidden_states(str(target_dir), data, tmp_path / "cache",
                          CaptureConfig(layers="eagle3", storage_dtype="fp32"), progress=False, log=lambda *_: None)
    shutil.rmtree(data)
    save_rows(rows, data)  # the dataset now has 8 rows
    train = ["train", f"target={target_dir}", "data.mode=offline", f"data.cache={tmp_path / 'cache'}",
             f"out_dir={tmp_path / 'run'}", "model.ttt_steps=2", "model.num_speculative_tokens=2", "optim.max_steps=1",
             "data.eval_rows=1", "tracking=none", "log.progress=false", "checkpoint.every=0"]
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(train)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.rstrip("\n").split("\n")[-1]  # transformers' loading bar may precede it
    assert err.startswith(f"error: the cache {tmp_path / 'cache'} is stale"), err
    old, new = re.findall(r"digest (?:is now )?([0-9a-f]{16})", err)
    assert old != new and "(6 rows)" in err and "(8 rows)" in err
    assert not (tmp_path / "run" / "drafter").exists()
    refresh = re.search(r"Refresh the cache: draftsmith (data capture .*?), then train with data.cache=(\S+)", err)
    assert refresh, err
    assert main([*shlex.split(refresh.group(1)), "--no-progress"]) == 0
    assert main([*train[:3], f"data.cache={refresh.group(2)}", *train[4:]]) == 0
    assert (tmp_path / "run" / "drafter" / "model.safetensors").is_file()
