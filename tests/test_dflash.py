"""DFlash (serve/methods/dflash/): the head's tensors as the engines name them, the decoder drafting exactly what
training evaluates, the mask token, and the recipe's refusals. Training and exact decoding (greedy at batch 1
and batched, trees, sampling) are in test_train_methods, test_batch_decoder and test_decoder_sampling."""
from __future__ import annotations

import pytest
import torch

from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.core.layers import FINAL
from draftsmith.serve.core.target import load_target
from draftsmith.serve.drafters.folder import build_head, make_drafter
from draftsmith.serve.methods.dflash.head import choose_mask_token, dflash_config
from draftsmith.serve.methods.dflash.objective import DFlashObjective, block_allowed, draw_anchors
from draftsmith.serve.methods.objective import FeatureBatch, TargetParts


@pytest.fixture(scope="module")
def target(tiny_target_dir):
    return load_target(tiny_target_dir)


def test_tensor_names_follow_the_engines_and_the_target_keeps_embeddings_and_lm_head(target):
    cfg = dflash_config(target, aux_layer_ids=[0, 1], block_size=4, draft_layers=2)
    state = build_head(cfg).state_dict()
    assert state["fc.weight"].shape == (32, 64) and state["hidden_norm.weight"].shape == (32,)
    for i in range(2):
        for name in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm"):
            assert f"layers.{i}.self_attn.{name}.weight" in state
        assert f"layers.{i}.input_layernorm.weight" in state and f"layers.{i}.mlp.gate_proj.weight" in state
    assert "norm.weight" in state and not any("embed" in k or "lm_head" in k for k in state)
    assert cfg.num_speculative_tokens == 3 and cfg.block_size == 4


def test_the_decoder_drafts_what_training_evaluates(target):
    """A block anchored after a prompt drafts, in the decoder, the tokens the objective's teacher-forced evaluation
    drafts for that row (the same context, the same positions), for a random head."""
    torch.manual_seed(3)
    head = build_head(dflash_config(target, aux_layer_ids=[0, 1], block_size=4))
    objective = DFlashObjective(head, TargetParts.of(target))
    ids = torch.randint(0, 256, (1, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = target.model(ids, output_hidden_states=True)
    states = {i: out.hidden_states[i + 1] for i in range(target.num_layers)}
    states[FINAL] = out.hidden_states[-1]
    drafts = objective.draft_ids(FeatureBatch(ids, torch.ones_like(ids), states, torch.ones_like(ids)), 3)
    drafter = make_drafter(head, target, check=False)
    for anchor in (3, 11, 20):
        drafter.begin(ids[0, :anchor], ids[0, 1:anchor + 1], {k: v[0, :anchor] for k, v in states.items()})
        proposed = drafter.propose(3).leading_chain().tokens.tolist()
        assert proposed == [int(drafts[j][0, anchor - 1]) for j in range(3)], anchor
    # committed in two steps, the context is the same as given at once
    drafter.begin(ids[0, :5], ids[0, 1:6], {k: v[0, :5] for k, v in states.items()})
    drafter.propose(3)
    drafter.commit(ids[0, 6:12], {k: v[0, 5:11] for k, v in states.items()})
    assert drafter.propose(3).leading_chain().tokens.tolist() == [int(drafts[j][0, 10]) for j in range(3)]


def test_anchors_are_seeded_per_row_and_blocks_see_only_their_past():
    candidates = torch.zeros(2, 10, dtype=torch.bool)
    candidates[0, 1:8] = True
    candidates[1, 2:4] = True
    seeds = torch.tensor([5, 6])
    anchors, valid = draw_anchors(candidates, 3, seeds)
    again, _ = draw_anchors(candidates, 3, seeds)
    assert torch.equal(anchors, again) and valid.tolist() == [[True] * 3, [True, True, False]]
    assert anchors[1, :2].tolist() == [2, 3] and all(candidates[0, a] for a in anchors[0])
    allowed = block_allowed(torch.tensor([[2, 5]]), 3, 10)  # (1, 6, 16)
    assert allowed[0, 0, :10].tolist() == [True, True] + [False] * 8  # block at 2 sees positions 0, 1
    assert allowed[0, 4, :10].tolist() == [True] * 5 + [False] * 5
    assert allowed[0, 1, 10:].tolist() == [True] * 3 + [False] * 3  # its own block, both ways, not the other


def test_mask_token_is_a_row_that_carries_something(target):
    # the tiny target's pad row is all zeros (nn.Embedding's padding_idx): the eos token is chosen instead
    pad = target.tokenizer.pad_token_id
    assert not target.model.get_input_embeddings().weight[pad].any()
    token, source = choose_mask_token(target)
    assert token == target.tokenizer.eos_token_id and "eos" in source
    assert choose_mask_token(target, 7) == (7, "model.mask_token_id")
    with pytest.raises(DraftsmithError, match="outside the target's vocabulary"):
        choose_mask_token(target, 10_000)
    with pytest.raises(DraftsmithError, match="embedding row is all zeros"):
        choose_mask_token(target, pad)


@pytest.mark.parametrize("size, message", [(1, "at least one drafted"), (65, "at most 64")])
def test_block_sizes_out_of_range_are_refused(target, size, message):
    with pytest.raises(DraftsmithError, match=message):
        dflash_config(target, aux_layer_ids=[0, 1], block_size=size)


@pytest.fixture(scope="module")
def exported(tiny_target_factory, tmp_path_factory):
    from draftsmith.serve.export import export_drafter
    from tests.export_fixtures import make_native

    target = load_target(tiny_target_factory("llama", num_hidden_layers=4))  # the engines' aux layers need 4
    root = tmp_path_factory.mktemp("dflash-export")
    native = make_native(target, "dflash", root / "native", seed=3)
    report = export_drafter(native, "vllm", root / "vllm", target=target, max_new_tokens=12)
    return target, native, root / "vllm", report


def test_vllm_export_reads_back_drafting_as_the_native(exported):
    import json

    from safetensors.torch import load_file

    _, native, out, report = exported
    assert report.proposals_compared > 0 and report.mu_native == report.mu_readback and report.k == 3
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"] and config["model_type"] == "qwen3"
    assert config["num_hidden_layers"] == 2 and config["block_size"] == 4
    assert config["dflash_config"] == {"mask_token_id": json.loads((native / "config.json").read_text())[
        "mask_token_id"], "target_layer_ids": [0, 1, 2]}
    assert config["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]  # vLLM's convention: inputs of layers
    state, tensors = load_file(str(native / "model.safetensors")), load_file(str(out / "model.safetensors"))
    blocks = state["fc.weight"].chunk(3, dim=1)  # aux ids [2, 0, 1]: the engine concatenates layers 0, 1, 2
    assert torch.equal(tensors["fc.weight"], torch.cat([blocks[1], blocks[2], blocks[0]], dim=1))
    assert set(tensors) == set(state) and not any("embed" in k or "lm_head" in k for k in tensors)
    assert '"method": "dflash"' in (out / "README.md").read_text()


def test_speculators_folder_is_read_back_as_vllm_reads_it(exported, tmp_path):
    import json

    from draftsmith.serve.export import export_drafter

    target, native, out, _ = exported
    report = export_drafter(native, "speculators", tmp_path / "spec", target=target, max_new_tokens=12)
    assert report.proposals_compared > 0 and report.mu_native == report.mu_readback
    config = json.loads((tmp_path / "spec" / "config.json").read_text())
    assert config["speculators_model_type"] == "dflash" and config["aux_hidden_state_layer_ids"] == [1, 2, 3]
    assert config["transformer_layer_config"]["model_type"] == "qwen3" and config["block_size"] == 4
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 3
    assert (tmp_path / "spec" / "model.safetensors").read_bytes() == (out / "model.safetensors").read_bytes()


def test_sglang_reads_the_same_folder_by_its_target_layer_ids(exported, tmp_path):
    from draftsmith.serve.export import export_drafter

    target, native, out, _ = exported
    report = export_drafter(native, "sglang", tmp_path / "sglang", target=target, max_new_tokens=12)
    assert report.proposals_compared > 0 and report.mu_native == report.mu_readback
    assert (tmp_path / "sglang" / "model.safetensors").read_bytes() == (out / "model.safetensors").read_bytes()
    readme = (tmp_path / "sglang" / "README.md").read_text()
    assert "--speculative-algorithm DFLASH" in readme and "--speculative-num-steps 1 " in readme


def test_a_folder_vllm_would_read_otherwise_is_refused(exported, tmp_path):
    import json
    import shutil

    from draftsmith.serve.export.common import ExportError
    from draftsmith.serve.export.readback import read_head

    target, _, out, _ = exported
    for n, (change, message) in enumerate((({"layer_types": ["sliding_attention"] * 2}, "causal or sliding-window"),
                                           ({"dflash_config": {"target_layer_ids": [0, 1, 2]}},
                                            "mask_token_id is missing"))):
        broken = tmp_path / str(n)
        shutil.copytree(out, broken)
        config = {**json.loads((out / "config.json").read_text()), **change}
        (broken / "config.json").write_text(json.dumps(config))
        with pytest.raises(ExportError, match=message):
            read_head(broken, target, fmt="vllm")


@pytest.mark.parametrize("fmt, version, message", [
    ("vllm", "0.19", "does not load in vLLM 0.19: vLLM has no DFlash draft model before 0.20"),
    ("sglang", "0.5.10", "does not load in SGLang 0.5.10: SGLang has no DFlash draft model before 0.5.11"),
    ("speculators", "0.19", "does not load in vLLM 0.19: vLLM reads no DFlash speculators folder before 0.20")])
def test_an_engine_export_it_lacks_is_one_line_and_nothing_written(exported, tmp_path, fmt, version, message):
    from draftsmith.serve.export import export_drafter

    target, native, _, _ = exported
    with pytest.raises(DraftsmithError, match=message) as err:
        export_drafter(native, fmt, tmp_path / "out", target=target, engine_version=version)
    assert "\n" not in str(err.value) and not (tmp_path / "out").exists()
