"""An MTP drafter exports as a copy of the target's checkpoint with its layer merged in (vLLM `method: mtp`, SGLang
NEXTN): every other tensor bit-identical, the target's own folder untouched, the layer read back from OUT drafting as
the native drafter does; the formats and families that cannot carry it are refused in one line, nothing written."""
from __future__ import annotations

import hashlib
import json

import pytest
import torch

from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.core.target import load_target
from draftsmith.serve.drafters.folder import save_drafter
from draftsmith.serve.export import export_drafter
from draftsmith.serve.methods.mtp.head import MtpHead, mtp_config
from tests.cli_fixtures import cli_error
from tests.mtp_fixtures import save_mtp_target
from tests.tiny_models import save_tiny_target


def _digests(folder) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.fixture(scope="module")
def shipped(tmp_path_factory):
    """(target folder, a fine-tuned MTP drafter folder of it: another random layer of the shipped shape)."""
    root = tmp_path_factory.mktemp("mtp-export")
    folder = save_mtp_target(root / "target", "qwen3_5")
    target = load_target(folder)
    torch.manual_seed(9)
    cfg = mtp_config(target, num_speculative_tokens=3, ttt_steps=3, norm_output=True)
    return folder, save_drafter(MtpHead(cfg), cfg, root / "drafter")


@pytest.mark.parametrize("fmt", ["vllm", "sglang"])
def test_the_export_is_the_target_checkpoint_with_the_drafters_layer(shipped, tmp_path, fmt):
    from draftsmith.serve.drafters.folder import load_head
    from draftsmith.serve.methods.mtp.from_target import shipped_head
    from draftsmith.serve.methods.mtp.shipped import INDEX

    folder, drafter = shipped
    before = _digests(folder)
    target = load_target(folder)
    report = export_drafter(drafter, fmt, tmp_path / "out", target=target, max_new_tokens=16)
    out = tmp_path / "out"
    assert _digests(folder) == before  # the target's own folder is only read
    assert report.mu_native == report.mu_readback and report.proposals_compared > 0
    assert any("bit for bit" in line and "replacing" in line for line in report.checks)
    assert ("mtp" if fmt == "vllm" else "NEXTN") in report.notes[0]
    index = json.loads((out / INDEX).read_text())["weight_map"]
    assert index["mtp.fc.weight"] == "model-mtp.safetensors" and index["lm_head.weight"] == "model.safetensors"
    # the layer OUT ships is the drafter's, and OUT loads as the target it was (same logits)
    merged = load_target(out)
    mine = load_head(drafter).state_dict()
    assert all(torch.equal(v, mine[k]) for k, v in shipped_head(merged).state_dict().items())
    ids = torch.tensor([[5, 6, 7, 8]])
    assert torch.equal(merged.model(ids).logits, target.model(ids).logits)


def test_formats_and_families_without_an_mtp_form_are_refused_in_one_line(shipped, tmp_path, capsys):
    folder, drafter = shipped
    line = cli_error(capsys, "export", "--drafter", drafter, "--format", "speculators", "--out", tmp_path / "s",
                     "--target", folder)
    assert "serve MTP layers from the target's own checkpoint" in line and not (tmp_path / "s").exists()
    llama = save_tiny_target(tmp_path / "llama", "llama")
    target = load_target(llama)
    cfg = mtp_config(target)
    fresh = save_drafter(MtpHead(cfg), cfg, tmp_path / "llama-mtp")
    line = cli_error(capsys, "export", "--drafter", fresh, "--format", "vllm", "--out", tmp_path / "l")
    assert "has no MTP model in the engines" in line and "draftsmith serve" in line
    assert not (tmp_path / "l").exists()


def test_an_export_into_a_folder_that_holds_a_checkpoint_is_refused(shipped, tmp_path):
    folder, drafter = shipped
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "model.safetensors").write_bytes(b"theirs")
    with pytest.raises(DraftsmithError) as refused:
        export_drafter(drafter, "vllm", tmp_path / "busy", target=load_target(folder))
    assert "not a draftsmith export" in str(refused.value)
    assert (tmp_path / "busy" / "model.safetensors").read_bytes() == b"theirs"
