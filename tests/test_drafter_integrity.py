"""A damaged drafter folder is refused with one line saying what happened and what to do, never a traceback and
never a silent mu of 1.00: truncated or corrupted-in-place weights (checked against checksums.json), NaN / inf
weights, a config.json that is not JSON, not an object, or has fields of the wrong type. A folder written before
checksums existed still loads."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from draftsmith.serve.drafters import build_drafter
from draftsmith.serve.drafters.folder import CHECKSUMS_NAME, build_head, load_head, read_config, save_drafter
from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.core.target import load_target
from tests.cli_fixtures import cli_error


@pytest.fixture(scope="module")
def target(tiny_target_dir):
    return load_target(tiny_target_dir)


@pytest.fixture(scope="module")
def saved(target, tmp_path_factory):
    from draftsmith.serve.methods.eagle3.head import eagle3_config

    torch.manual_seed(0)
    cfg = eagle3_config(target, aux_layer_ids=[0, 1, 1], draft_vocab_size=64)
    return save_drafter(build_head(cfg), cfg, tmp_path_factory.mktemp("native") / "eagle3")


@pytest.fixture
def folder(saved, tmp_path):
    return shutil.copytree(saved, tmp_path / "d")


def test_the_folder_records_and_checks_its_weights(folder, target):
    checksums = json.loads((folder / CHECKSUMS_NAME).read_text())["model.safetensors"]
    assert checksums["bytes"] == (folder / "model.safetensors").stat().st_size and len(checksums["sha256"]) == 64
    build_drafter(str(folder), target)
    (folder / CHECKSUMS_NAME).unlink()  # a folder written before checksums were recorded loads unchecked
    build_drafter(str(folder), target)


def test_truncated_weights(folder, target, tiny_target_dir, capsys):
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    with pytest.raises(DraftsmithError, match=r"is \d+ bytes but was written as \d+ \(a truncated or partial copy"):
        load_head(folder)
    err = cli_error(capsys, "generate", "--target", str(tiny_target_dir), "--drafter", str(folder), "--prompt", "ab")
    assert "truncated" in err
    (folder / CHECKSUMS_NAME).unlink()  # no checksum to compare with: safetensors itself finds the damage
    with pytest.raises(DraftsmithError, match="cannot be read as safetensors .*truncated copy"):
        load_head(folder)


def test_weights_corrupted_in_place(folder):
    weights = folder / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-7] ^= 0x40  # one flipped bit inside a tensor: same size, still a valid file
    weights.write_bytes(bytes(data))
    with pytest.raises(DraftsmithError, match="has changed since it was written .*sha256 differs"):
        load_head(folder)


def test_non_finite_weights_are_refused(folder, target):
    tensors = load_file(str(folder / "model.safetensors"))
    tensors["fc.weight"][0, 0] = float("nan")
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / CHECKSUMS_NAME).unlink()  # as a diverged run of an older draftsmith would have left it
    with pytest.raises(DraftsmithError, match=r"hold NaN or inf in 1 tensor\(s\) \(fc.weight\): training diverged"):
        build_drafter(str(folder), target)
    cfg = read_config(folder)
    bad = build_head(cfg)
    with torch.no_grad():
        next(bad.parameters()).fill_(float("inf"))
    with pytest.raises(DraftsmithError, match="NaN or inf"):  # and training never writes them
        save_drafter(bad, cfg, folder.parent / "never")
    assert not (folder.parent / "never" / "model.safetensors").exists()


@pytest.mark.parametrize("damage, message", [
    (lambda c: c[: len(c) // 2], "config.json is not valid JSON"),
    (lambda c: "[1, 2]", "holds a JSON list, not a drafter config"),
    (lambda c: c.replace('"hidden_size": 32', '"hidden_size": "32"'), "hidden_size='32' is not of type int"),
    (lambda c: c.replace('"hidden_size": 32', '"hidden_size": 0'), "hidden_size must be at least 1, got 0"),
    (lambda c: c.replace('"hidden_size": 32,', ''), r"lacks \['hidden_size'\]: the drafter folder is damaged"),
    (lambda c: c.replace('"draft_vocab_size": 64', '"draft_vocab_size": 80'), "do not match its config.json"),
])
def test_invalid_config_json(folder, target, tiny_target_dir, capsys, damage, message):
    path = folder / "config.json"
    path.write_text(damage(path.read_text()))
    with pytest.raises(DraftsmithError, match=message):
        build_drafter(str(folder), target)
    assert cli_error(capsys, "generate", "--target", str(tiny_target_dir), "--drafter", str(folder), "--prompt",
                     "ab").startswith("error: ")
