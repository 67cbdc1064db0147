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



@pytest.mark.parametrize("fmt", ["vllm", "sglang", "speculators"])
def test_an_engine_export_is_one_line_saying_what_is_missing(target, tmp_path, fmt):
    from draftsmith.serve.drafters.folder import save_drafter
    from draftsmith.serve.export import export_drafter

    config = dflash_config(target, aux_layer_ids=[0, 1], block_size=4)
    folder = save_drafter(build_head(config), config, tmp_path / "native")
    with pytest.raises(DraftsmithError, match="serve DFlash, but draftsmith does not write their DFlash folders yet"):
        export_drafter(folder, fmt, tmp_path / "out", target=target)
    assert not (tmp_path / "out").exists()
