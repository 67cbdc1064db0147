"""The native drafter folder: round trip, registration in build_drafter, and refusing another target."""
from __future__ import annotations

import json

import pytest
import torch

from draftsmith.serve.drafters import build_drafter
from draftsmith.serve.methods.eagle3.head import eagle3_config
from draftsmith.serve.drafters.folder import build_head, load_drafter, load_head, save_drafter
from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.core.layers import FINAL
from draftsmith.serve.core.target import load_target


def test_the_same_head_is_the_same_bytes(tmp_path, tiny_target_dir):
    """Saved twice, a head's folder is byte for byte the same (safetensors' metadata would come in either order with
    two keys): a reproduced run can be compared by its checksums.json."""
    target = load_target(tiny_target_dir)
    cfg = eagle3_config(target, aux_layer_ids=[0, 1, 1])
    torch.manual_seed(0)
    head = build_head(cfg)
    files = [save_drafter(head, cfg, tmp_path / f"d{i}") for i in range(4)]
    for name in ("model.safetensors", "checksums.json", "config.json"):
        assert len({(f / name).read_bytes() for f in files}) == 1, name


def test_folder_round_trip_and_build_drafter(tmp_path, tiny_target_dir):
    target = load_target(tiny_target_dir)
    cfg = eagle3_config(target, draft_vocab_size=64, aux_layer_ids=[0, 1, 1], ttt_steps=3)
    torch.manual_seed(0)
    head = build_head(cfg)
    head.set_vocab(torch.arange(64) * 3 - torch.arange(64), torch.isin(torch.arange(259), torch.arange(64) * 3))
    folder = save_drafter(head, cfg, tmp_path / "d")
    config = json.loads((folder / "config.json").read_text())
    for key in ("method", "hidden_size", "num_speculative_tokens", "target_name", "target_config_hash",
                "target_tokenizer_hash", "aux_layer_ids", "layer_convention", "draft_vocab_size",
                "input_layernorm", "hidden_norm", "layer_config", "ttt_steps"):
        assert key in config, key
    assert config["aux_layer_ids"] == [0, 1, 1] and "hidden_states[i+1]" in config["layer_convention"]
    loaded = load_head(folder)
    for name, tensor in head.state_dict().items():
        assert torch.equal(tensor, loaded.state_dict()[name]), name
    drafter = build_drafter(str(folder), target)
    assert drafter.kind == "eagle3" and drafter.target_layers == (0, 1, 1)
    ids = torch.arange(5, 15)
    out = target.model(ids[None], output_hidden_states=True)
    hs = {0: out.hidden_states[1][0], 1: out.hidden_states[2][0], FINAL: out.hidden_states[-1][0]}
    drafter.begin(ids, torch.cat([ids[1:], ids[:1]]), hs)
    assert all(t % 3 == 0 for t in drafter.propose(4).tokens.tolist())  # inside the draft vocabulary


def test_loading_against_another_target_is_a_clear_error(tmp_path, tiny_target_factory):
    from draftsmith.serve.methods.eagle1.head import eagle1_config

    target = load_target(tiny_target_factory("llama"))
    folder = save_drafter(build_head(eagle1_config(target)), eagle1_config(target), tmp_path / "d")
    other_tokenizer = tmp_path / "other"
    import shutil

    shutil.copytree(tiny_target_factory("llama"), other_tokenizer)
    from tests.tiny_models import tiny_tokenizer

    tok = tiny_tokenizer()
    tok.add_tokens(["<extra>"])
    tok.save_pretrained(other_tokenizer)
    with pytest.raises(DraftsmithError, match=r"trained for target .* tokenizer hash"):
        load_drafter(folder, load_target(other_tokenizer))
    with pytest.raises(DraftsmithError, match="config hash"):
        build_drafter(str(folder), load_target(tiny_target_factory("llama", num_hidden_layers=3)))
    with pytest.raises(DraftsmithError, match="not a draftsmith drafter folder"):
        load_drafter(tmp_path, target)
