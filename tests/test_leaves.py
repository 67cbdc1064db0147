"""Leaves on greedy EAGLE chains: the maths of choosing them, their calibration, and greedy identity when they are
hung on every cycle."""
from __future__ import annotations

import pytest
import torch

from draftsmith.serve.core.costs import VerifyCosts
from draftsmith.serve.decoding import plain_generate, speculative_generate
from draftsmith.serve.drafters import DrafterSpecError, build_drafter
from draftsmith.serve.drafters.length import ExpectedGain, FixedLength, LastDraft
from draftsmith.serve.drafters.heads_common import confidence_signal, read_positions
from draftsmith.serve.drafters.leaves import Leaf, choose_leaves, leaf_gains, leaf_tree, leaves_of
from draftsmith.serve.core.target import load_target
from draftsmith.serve.tree import ancestor_mask

FLAT = VerifyCosts(ratios={0: 1.0, 32: 1.0}, step_seconds=0.01)  # extra verified rows cost nothing
STEEP = VerifyCosts(ratios={0: 1.0, 1: 1.6, 2: 2.2, 3: 2.8, 8: 6.0}, step_seconds=0.01)  # each row costs 0.6
PROMPTS = ["hello hello hello world", "abcabcabcabc", "def f(x):\n    return x", "The quick brown fox"]


def test_runner_ups_skip_the_top_token_and_carry_the_conditional_prior():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    reading = read_positions(logits[None], 2)[0]
    leaves = leaves_of(reading.top_probs, reading.top_ids, depth=2)
    assert [leaf.token for leaf in leaves] == [1, 2] and [leaf.rank for leaf in leaves] == [1, 2]
    assert leaves[0].prior == pytest.approx(0.6) and leaves[1].prior == pytest.approx(0.3)  # q / (1 - q(top))
    assert leaves[0].key != leaves[1].key and all(leaf.depth == 2 for leaf in leaves)
    alone = read_positions(logits[None], 0)[0]  # no runner-up read
    assert leaves_of(alone.top_probs, alone.top_ids, depth=1) == []


def test_positions_read_together_read_what_each_reads_alone():
    """A batch's chains read their positions in one softmax, top-k and argmax (heads_common.read_positions): each
    row's signal, greedy token and runner-ups equal what its own logits give, bf16 near-ties included."""
    logits = torch.randn(16, 4096, generator=torch.Generator().manual_seed(0)).mul(3).bfloat16().float()
    logits[3, [5, 9, 700]] = logits[3].max() + 1  # a three-way tie for the top: the first index is greedy's
    readings = read_positions(logits, 3)
    for row, reading in zip(logits, readings):
        assert reading == read_positions(row[None], 3)[0]
        for group in (0, 1):
            assert reading.confidence(group) == confidence_signal(row, group)
        assert reading.argmax == int(torch.argmax(row))
        top = torch.topk(torch.softmax(row, dim=-1), 4)
        assert reading.top_probs == top.values.tolist() and reading.top_ids == top.indices.tolist()
    assert readings[3].argmax == 5 and sorted(readings[3].top_ids[:3]) == [5, 9, 700]


def test_leaf_gains_weigh_reach_and_rejection_and_keep_one_depth_exclusive():
    accept = [0.5, 0.4]
    gains = leaf_gains(accept, [(1, 0.2), (2, 0.5)])
    assert gains[0] == pytest.approx(1.0 * 0.5 * 0.2)  # reached always, chain token 1 rejected half the time
    assert gains[1] == pytest.approx(0.5 * 0.6 * 0.5)  # reached when token 1 is accepted
    # two leaves of one depth cannot both be the target's token: b's summing past 1 are scaled down
    both = leaf_gains([0.0], [(1, 0.8), (1, 0.8)])
    assert sum(both) == pytest.approx(1.0)


def test_choose_leaves_takes_the_best_while_the_rate_improves():
    gains = [0.05, 0.3, 0.1]
    assert choose_leaves(1.5, 2, gains, FLAT.ratio, limit=8) == [1, 2, 0]  # free rows: every positive gain
    assert choose_leaves(1.5, 2, gains, FLAT.ratio, limit=2) == [1, 2]
    assert choose_leaves(1.5, 2, gains, lambda m: 1.0 + 0.6 * m, limit=8) == []  # a row costs more than it gains
    # a step in the verify cost at 3 rows: one leaf does not pay for it, but the plateau after it lets three pay
    stepped = lambda m: 1.0 if m <= 2 else 1.4  # noqa: E731
    assert choose_leaves(1.0, 2, [0.2, 0.2, 0.2], stepped, limit=8) == [0, 1, 2]
    assert choose_leaves(1.0, 2, [0.2, 0.2, 0.2], stepped, limit=1) == []
    assert choose_leaves(1.0, 1, [0.0, -0.1], FLAT.ratio, limit=8) == []


def test_leaf_tree_hangs_each_leaf_under_the_chain_token_before_its_depth():
    leaves = [Leaf(depth=1, rank=1, token=7, key="a", prior=0.1), Leaf(depth=3, rank=2, token=9, key="b", prior=0.1)]
    tokens, parents = leaf_tree([4, 5, 6], leaves)
    assert tokens == [4, 5, 6, 7, 9] and parents == [-1, 0, 1, -1, 1]
    mask = ancestor_mask(torch.tensor(parents))
    assert mask[5].tolist() == [True, True, True, False, False, True]  # leaf at depth 3 sees d1, d2 and itself


def test_the_policy_learns_leaves_from_the_target_token_at_the_first_rejection():
    policy = ExpectedGain(FLAT)
    policy.start(2)
    leaves = [Leaf(1, 1, 7, ("leaf", 0, 1, 3), 0.3), Leaf(2, 1, 8, ("leaf", 1, 1, 3), 0.3)]
    before = policy.calibration[False].predict(leaves[0].key, 0.3)
    last = LastDraft(tokens=[5, 6], leaves=leaves)
    last.settle(policy, torch.tensor([7, 2]))  # d1 rejected, the target's token was the depth-1 leaf
    table = policy.calibration[False]
    assert table.predict(leaves[0].key, 0.3) > before
    assert table.counts.get(leaves[1].key) is None  # depth 2 was never reached
    last = LastDraft(tokens=[5, 6], leaves=leaves)
    last.settle(policy, torch.tensor([5, 3]))  # d1 accepted, d2 rejected for a token no leaf had
    assert table.predict(leaves[1].key, 0.3) < 0.3
    assert FixedLength().leaves(leaves, limit=8) == []  # a fixed K drafts plain chains


def test_the_policy_hangs_leaves_only_where_rows_are_cheap():
    leaves = [Leaf(1, 1, 7, ("leaf", 0, 1, 3), 0.3), Leaf(2, 1, 8, ("leaf", 1, 1, 3), 0.3)]
    for costs, wanted in ((FLAT, 2), (STEEP, 0)):
        policy = ExpectedGain(costs)
        policy.start(2)
        policy._accept = [0.5, 0.5]  # the chain kept this cycle
        assert len(policy.leaves(leaves, limit=8)) == wanted
        assert policy.leaves(leaves, limit=0) == []


def _folder(target, tmp_path, method="eagle3"):
    from draftsmith.serve.methods.eagle3.head import eagle3_config
    from draftsmith.serve.drafters.folder import build_head, save_drafter
    from draftsmith.serve.methods.medusa.head import medusa_config

    cfg = eagle3_config(target, aux_layer_ids=[0, 1, 1]) if method == "eagle3" else medusa_config(target, num_heads=3)
    torch.manual_seed(0)
    return str(save_drafter(build_head(cfg), cfg, tmp_path / method))


@pytest.mark.parametrize("spec", ["eagle3", "hybrid:eagle3", "medusa"])
def test_greedy_identity_with_leaves_on_every_cycle(tiny_target_dir, tmp_path, spec):
    """Rows free and a head that always pays: every drafting cycle verifies a tree of chain and leaves, and the
    output stays token-identical to plain greedy decoding."""
    target = load_target(tiny_target_dir)
    method = spec.rpartition(":")[2]
    drafter = build_drafter(spec.replace(method, _folder(target, tmp_path, method)), target)
    head = drafter.head if spec.startswith("hybrid") else drafter
    head.policy = ExpectedGain(FLAT, step_cost=0.001)
    head.policy.rate = 10.0  # never paused
    head.policy.record_cycle = lambda *a, **kw: None
    if spec.startswith("hybrid"):
        drafter.policy = head.policy
        drafter.ngram.policy = ExpectedGain(FLAT)
    hung = []
    choose = head.policy.leaves
    head.policy.leaves = lambda candidates, *, limit: hung.append(choose(candidates, limit=limit)) or hung[-1]
    for text in PROMPTS:
        ids = torch.tensor([target.tokenizer.encode(text)])
        ref = plain_generate(target, ids, max_new_tokens=30, eos_token_ids=())
        for k in (1, 3, 5):
            got = speculative_generate(target, drafter, ids, max_new_tokens=30, k=k, eos_token_ids=())
            assert got.output_ids == ref.output_ids, (spec, k, text)
            # K caps the head's chains; a hybrid's n-gram side may draft a copied passage past it
            assert max(got.stats.drafted_per_cycle) <= drafter.draft_cap(k) == (16 if spec.startswith("hybrid") else k)
    assert sum(map(bool, hung)) > 10  # cycles verified a chain with leaves
    leaf_counts = [c for key, c in head.policy.calibration[False].counts.items() if key[0] == "leaf"]
    assert leaf_counts  # learned from
    if method == "eagle3":  # this random head's runner-ups are sometimes right: accepted leaves were committed too
        assert any(accepted > 0 for accepted, _ in leaf_counts)


def test_leaves_option(tiny_target_dir, tmp_path):
    target = load_target(tiny_target_dir)
    folder = _folder(target, tmp_path)
    assert build_drafter(folder, target).max_leaves == 8
    assert build_drafter(f"{folder}:leaves=0", target).max_leaves == 0
    with pytest.raises(DrafterSpecError, match="bad drafter option"):
        build_drafter(f"{folder}:leaves=many", target)
    with pytest.raises(DrafterSpecError, match="leaves must be >= 0"):
        build_drafter(f"{folder}:leaves=-1", target)
    medusa = _folder(target, tmp_path, "medusa")
    assert build_drafter(f"{medusa}:leaves=2", target).max_leaves == 2
