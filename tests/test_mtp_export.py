"""An MTP drafter exports as a copy of the target's checkpoint with its layer merged in (vLLM `method: mtp`, SGLang
NEXTN): every other tensor bit-identical (MiMo-V2's other MTP layers too), the target's own folder untouched, the
layer read back from OUT drafting as the native drafter does; the formats and families that cannot carry it are
refused in one line, nothing written."""
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


def test_the_readmes_mtp_commands_run_as_written(tmp_path):
    """The README's MTP section on a tiny Qwen3.5 target that ships a layer: eval of the shipped layer, its
    fine-tune (starting from it), both side by side, the merged export (the engines' servers skipped)."""
    import os
    import re
    import subprocess
    import sys
    from pathlib import Path

    from tests.test_readme_quickstarts import ROOT, SKIPPED

    section = (ROOT / "README.md").read_text().split("## Your target's own drafter: MTP layers")[1].split("\n## ")[0]
    block = re.findall(r"```bash\n(.*?)```", section, flags=re.S)[0]
    commands = [line.split(" #")[0].strip() for line in re.sub(r"\\\n\s*", "", block).splitlines()
                if line.strip() and not line.startswith("#")]
    target = save_mtp_target(tmp_path / "target", "qwen3_5")
    rows = [{"prompt": f"Say {i} in words, then count to {i % 7 + 3}.", "domain": ("math", "chat")[i % 2]}
            for i in range(20)]
    (tmp_path / "my_traffic.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:16]))
    (tmp_path / "my_eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[16:]))
    env = {**os.environ, "T": str(target), "PYTHONPATH": str(ROOT), "WANDB_MODE": "offline",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    # quick start 1's data, smaller; the training recipe's defaults, shorter
    setup = "draftsmith data build --target $T --prompts my_traffic.jsonl --out runs/data/mine data.max_new_tokens=24"
    ran = []
    for command in [setup, *commands]:
        if command.startswith(SKIPPED):
            continue
        if command.startswith("draftsmith train"):
            command += " optim.max_steps=4 optim.batch_size=4 data.eval_rows=4 tracking=none"
        if command.startswith("draftsmith eval"):
            command += " --limit 2 --max-new-tokens 16 --no-peers --no-cost-model --quiet"
        proc = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=600)
        assert proc.returncode == 0, f"{command}\n{proc.stderr[-2000:]}"
        ran.append(command.split()[1])
    assert ran == ["data", "eval", "train", "eval", "export"]
    assert (tmp_path / "runs" / "mine" / "mtp-checkpoint" / "model-mtp.safetensors").is_file()


@pytest.mark.parametrize("family", ["deepseek_v3", "deepseek_v32"])
def test_a_deepseek_export_keeps_the_layers_copies_of_the_targets_tensors(tmp_path, family):
    """DeepSeek-V3's and V3.2's checkpoints keep copies of the embeddings and lm_head inside the MTP layer
    (model.layers.{N}.embed_tokens, .shared_head.head): the export replaces the layer's own tensors (V3.2's lightning
    indexer's among them) and keeps those bit for bit (the engines read the target's own, but a copy is a copy)."""
    from safetensors.torch import load_file, save_file

    from draftsmith.serve.methods.mtp.shipped import checkpoint_files, form_of

    folder = save_mtp_target(tmp_path / "target", family)
    path = folder / "model.safetensors"
    weights = load_file(str(path))
    prefix = f"model.layers.{json.loads((folder / 'config.json').read_text())['num_hidden_layers']}."
    copies = {prefix + "embed_tokens.weight": weights["model.embed_tokens.weight"].clone(),
              prefix + "shared_head.head.weight": weights["lm_head.weight"].clone()}
    save_file({**weights, **copies}, str(path), metadata={"format": "pt"})
    target = load_target(folder)
    torch.manual_seed(3)
    cfg = mtp_config(target, num_speculative_tokens=2, ttt_steps=2, norm_output=True,
                     overrides=dict(form_of(target.config).overrides))
    drafter = save_drafter(MtpHead(cfg), cfg, tmp_path / "drafter")
    report = export_drafter(drafter, "vllm", tmp_path / "out", target=target, max_new_tokens=12)
    assert report.mu_native == report.mu_readback
    merged = {}
    for shard in checkpoint_files(tmp_path / "out"):
        merged.update(load_file(str(shard)))
    assert all(torch.equal(merged[k], v) for k, v in copies.items())
    assert not torch.equal(merged[prefix + "eh_proj.weight"], weights[prefix + "eh_proj.weight"])
    if family == "deepseek_v32":
        assert not torch.equal(merged[prefix + "self_attn.indexer.wk.weight"],
                               weights[prefix + "self_attn.indexer.wk.weight"])


def test_a_mimo_export_replaces_layer_0_and_keeps_the_others(tmp_path):
    """MiMo-V2-Flash ships three MTP layers (model.mtp.layers.{0,1,2}) and the engines draft every step with layer 0:
    the export replaces layer 0 with the drafter's and keeps the others bit for bit; its config, which names no MTP
    count (the tensors say it ships them), is copied as it is."""
    from safetensors.torch import load_file, save_file

    from draftsmith.serve.methods.mtp.shipped import MIMO, checkpoint_files

    folder = save_mtp_target(tmp_path / "target", "mimo_v2_flash")
    path = folder / "model.safetensors"
    weights = load_file(str(path))
    second = {k.replace(".layers.0.", ".layers.1."): v.clone() for k, v in weights.items() if ".mtp.layers.0." in k}
    save_file({**weights, **second}, str(path), metadata={"format": "pt"})
    target = load_target(folder)
    torch.manual_seed(3)
    cfg = mtp_config(target, num_speculative_tokens=2, ttt_steps=2, norm_output=True, overrides=dict(MIMO.overrides))
    drafter = save_drafter(MtpHead(cfg), cfg, tmp_path / "drafter")
    report = export_drafter(drafter, "vllm", tmp_path / "out", target=target, max_new_tokens=12)
    assert report.mu_native == report.mu_readback and report.proposals_compared > 0
    merged = {}
    for shard in checkpoint_files(tmp_path / "out"):
        merged.update(load_file(str(shard)))
    assert all(torch.equal(merged[k], v) for k, v in second.items())
    assert not torch.equal(merged["model.mtp.layers.0.eh_proj.weight"], weights["model.mtp.layers.0.eh_proj.weight"])
    assert (tmp_path / "out" / "config.json").read_bytes() == (folder / "config.json").read_bytes()
