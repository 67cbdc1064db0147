"""P-EAGLE (serve/methods/peagle/): the head's tensors, the decoder drafting in one forward exactly what training
evaluates, the attention of the mask slots, and the recipe's refusals. Training and exact decoding (greedy at
batch 1 and batched, trees, sampling) are in test_train_methods, test_batch_decoder and test_decoder_sampling."""
from __future__ import annotations

import pytest
import torch

from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.core.layers import FINAL
from draftsmith.serve.core.target import load_target
from draftsmith.serve.drafters.folder import build_head, make_drafter
from draftsmith.serve.methods.objective import FeatureBatch, TargetParts
from draftsmith.serve.methods.peagle.head import peagle_config
from draftsmith.serve.methods.peagle.objective import PEagleObjective, parallel_allowed


@pytest.fixture(scope="module")
def target(tiny_target_dir):
    return load_target(tiny_target_dir)


def _states(target, ids):
    with torch.no_grad():
        out = target.model(ids, output_hidden_states=True)
    states = {i: out.hidden_states[i + 1] for i in range(target.num_layers)}
    states[FINAL] = out.hidden_states[-1]
    return states


def test_tensors_are_eagle3s_and_mask_hidden_before_fc(target):
    cfg = peagle_config(target, depths=4, aux_layer_ids=[0, 1, 1], draft_vocab_size=64)
    state = build_head(cfg).state_dict()
    assert state["mask_hidden"].shape == (3 * 32,) and state["fc.weight"].shape == (32, 96)
    assert "midlayer.self_attn.q_proj.weight" in state and state["lm_head.weight"].shape == (64, 32)
    assert cfg.method == "peagle" and cfg.num_speculative_tokens == 4 and cfg.ttt_steps == 1
    assert cfg.mask_token_id == target.tokenizer.eos_token_id  # the tiny target's pad row is all zeros


def test_slots_see_their_anchors_past_and_their_own_earlier_slots():
    allowed = parallel_allowed(torch.tensor([[2, 5]]), 3, 8)  # (1, 8 + 4, 8 + 4)
    assert allowed.shape == (1, 12, 12)
    assert allowed[0, 4, :8].tolist() == [True] * 5 + [False] * 3 and not allowed[0, 4, 8:].any()  # real: causal
    assert allowed[0, 8, :8].tolist() == [True] * 3 + [False] * 5  # anchor 2, depth 1: pairs 0..2
    assert allowed[0, 8, 8:].tolist() == [True, False, False, False]
    assert allowed[0, 9, 8:].tolist() == [True, True, False, False]  # depth 2 sees depth 1 of its block
    assert allowed[0, 11, 8:].tolist() == [False, False, True, True]  # anchor 5: not anchor 2's block


@pytest.mark.parametrize("fc_norm", [False, True])
def test_the_decoder_drafts_in_one_forward_what_training_evaluates(target, fc_norm):
    """Every depth drafted by the decoder from one forward equals the objective's teacher-forced draft for that row
    (the same context, positions and mask slots), for a random head with a reduced vocabulary."""
    torch.manual_seed(3)
    head = build_head(peagle_config(target, depths=4, aux_layer_ids=[0, 1, 1], draft_vocab_size=200,
                                    fc_norm=fc_norm))
    objective = PEagleObjective(head, TargetParts.of(target))
    ids = torch.randint(0, 256, (1, 24), generator=torch.Generator().manual_seed(1))
    states = _states(target, ids)
    drafts = objective.draft_ids(FeatureBatch(ids, torch.ones_like(ids), states, torch.ones_like(ids)), 4)
    drafter = make_drafter(head, target, check=False)
    calls = []
    head.register_forward_hook(lambda *args: calls.append(1))
    for t in (2, 11, 20):  # the pairs 0..t: the last drafts x_{t+2}
        drafter.begin(ids[0, :t + 1], ids[0, 1:t + 2], {k: v[0, :t + 1] for k, v in states.items()})
        calls.clear()
        proposed = drafter.propose(4).leading_chain().tokens.tolist()
        assert proposed == [int(drafts[d][0, t]) for d in range(4)], t
        assert len(calls) == 1  # the pending pairs and the slots in one forward
    # committed in two steps, after a draft whose slots must be forgotten, the context is the same
    drafter.begin(ids[0, :5], ids[0, 1:6], {k: v[0, :5] for k, v in states.items()})
    drafter.propose(4)
    drafter.commit(ids[0, 6:12], {k: v[0, 5:11] for k, v in states.items()})
    assert drafter.propose(4).leading_chain().tokens.tolist() == [int(drafts[d][0, 10]) for d in range(4)]
    assert drafter.propose(2).leading_chain().tokens.tolist() == [int(drafts[d][0, 10]) for d in range(2)]


def test_training_terms_are_one_per_depth_and_anchors_are_counted(target):
    torch.manual_seed(0)
    head = build_head(peagle_config(target, depths=3, aux_layer_ids=[0, 1, 1]))
    objective = PEagleObjective(head, TargetParts.of(target), anchors=4, kind="tv")
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(2))
    batch = FeatureBatch(ids, torch.ones_like(ids), _states(target, ids), torch.ones_like(ids))
    sums = objective(batch.input_ids, batch.loss_mask, batch.hidden_states, batch.attention_mask,
                     noise_seeds=torch.tensor([1, 2]))
    counts = objective.term_counts(batch)
    assert set(sums) == set(counts) == set(objective.term_weights()) == {"depth0", "depth1", "depth2"}
    assert float(counts["depth0"]) == 2 * 14 and float(counts["depth1"]) == float(counts["depth2"]) == 2 * 4
    assert all(0 < float(sums[t].detach()) <= float(counts[t]) for t in sums)  # tv is in [0, 1] per row
    sum(sums.values()).backward()
    assert head.mask_hidden.grad is not None and head.mask_hidden.grad.abs().sum() > 0
