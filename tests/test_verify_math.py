"""The pure functions of verification on hand-made cases."""
import torch

from draftsmith.serve.methods.ngram.drafter import continuation, lookup
from draftsmith.serve.core.sampling import greedy_tokens, process_logits, residual, sample, target_probs
from draftsmith.serve.tree import ancestor_mask, node_depths, path_to, static_tree_parents
from draftsmith.serve.verify import verify_chain, verify_greedy, verify_tree


def onehot(i, v=5):
    return torch.nn.functional.one_hot(torch.tensor(i), v).float()


def test_residual_is_normalized_positive_part():
    p = torch.tensor([0.5, 0.3, 0.2])
    q = torch.tensor([0.2, 0.6, 0.2])
    assert torch.allclose(residual(p, q), torch.tensor([1.0, 0.0, 0.0]))
    assert torch.allclose(residual(p, p), p)  # empty residual falls back to p


def test_sample_draws_each_token_at_its_probability_and_never_a_zero_one():
    p = torch.tensor([0.5, 0.0, 0.3, 0.0, 0.2])
    gen = torch.Generator().manual_seed(0)
    draws = torch.bincount(torch.tensor([sample(p, gen) for _ in range(20000)]), minlength=5).double() / 20000
    assert draws[1] == 0 and draws[3] == 0
    assert torch.allclose(draws, p.double(), atol=0.015)  # 4.5 standard errors at 20k draws
    assert sample(p * 7.0, torch.Generator().manual_seed(1)) in (0, 2, 4)  # unnormalized weights work too


def test_sample_of_a_one_hot_takes_its_token_without_drawing():
    gen = torch.Generator().manual_seed(0)
    state = gen.get_state()
    assert sample(onehot(3), gen) == 3 and sample(onehot(3) * 0.5, gen) == 3
    assert torch.equal(gen.get_state(), state)


def test_top_k_top_p_filtering():
    logits = torch.log(torch.tensor([0.5, 0.25, 0.15, 0.1]))
    assert torch.isinf(process_logits(logits, temperature=1.0, top_k=2)[2:]).all()
    kept = process_logits(logits, temperature=1.0, top_p=0.7)
    assert torch.isfinite(kept[:2]).all() and torch.isinf(kept[2:]).all()
    assert torch.equal(target_probs(logits, temperature=0), onehot(0, 4))


def test_greedy_chain_accepts_prefix_then_corrects():
    p = torch.stack([onehot(1), onehot(2), onehot(4), onehot(0)])  # argmax after pending, d1, d2, d3
    verdict = verify_chain(torch.tensor([1, 2, 3]), p, None, None)
    assert verdict.accepted == [0, 1] and verdict.next_token == 4
    verdict = verify_chain(torch.tensor([1, 2, 4]), p, None, None)
    assert verdict.accepted == [0, 1, 2] and verdict.next_token == 0  # bonus token


def test_sampled_chain_rejects_token_target_never_emits():
    p = torch.stack([torch.tensor([0.0, 1.0, 0, 0, 0]), onehot(3)])
    q = torch.stack([torch.tensor([0.5, 0.5, 0, 0, 0])])
    verdict = verify_chain(torch.tensor([0]), p, q, torch.Generator().manual_seed(0))
    assert verdict.accepted == [] and verdict.next_token == 1


def test_tree_greedy_follows_matching_branch():
    # root -> {a=2 (node0), b=3 (node1)}; a -> {c=4 (node2)}; b -> {d=1 (node3)}
    tokens, parents = torch.tensor([2, 3, 4, 1]), torch.tensor([-1, -1, 0, 1])
    p = torch.stack([onehot(3), onehot(0), onehot(1), onehot(0), onehot(2)])  # rows: root, n0..n3
    verdict = verify_tree(tokens, parents, p, None)
    assert verdict.accepted == [1, 3] and verdict.next_token == 2


def test_greedy_tokens_take_the_first_argmax_on_a_tie():
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0]])
    assert greedy_tokens(logits).tolist() == [1, 0] == logits.argmax(-1).tolist()
    assert torch.equal(target_probs(logits, temperature=0), torch.stack([onehot(1, 4), onehot(0, 4)]))


def test_greedy_verdicts_equal_the_one_hot_verifier_on_random_chains_and_trees():
    """verify_greedy (the argmax per row) gives the verdict verify_tree / verify_chain give on one-hot rows."""
    gen = torch.Generator().manual_seed(0)
    for _ in range(300):
        n = int(torch.randint(0, 7, (), generator=gen))
        tokens = torch.randint(0, 3, (n,), generator=gen)  # a 3-token vocabulary: many matches and mismatches
        best = torch.randint(0, 3, (n + 1,), generator=gen)
        p = torch.nn.functional.one_hot(best, 3).float()  # (n+1, 3)
        chain = verify_greedy(tokens, None, best)
        assert chain == verify_chain(tokens, p, None, None)
        parents = torch.tensor([int(torch.randint(-1, i, (), generator=gen)) for i in range(n)], dtype=torch.long)
        assert verify_greedy(tokens, parents, best) == verify_tree(tokens, parents, p, None)


def test_greedy_tree_follows_the_first_matching_child():
    tokens, parents = torch.tensor([2, 3, 2, 4]), torch.tensor([-1, -1, -1, 2])  # two root children propose 2
    verdict = verify_greedy(tokens, parents, torch.tensor([2, 0, 0, 4, 1]))
    assert verdict.accepted == [0] and verdict.next_token == 0  # the first child, not the one whose subtree matches
    assert verify_greedy(torch.tensor([], dtype=torch.long), None, torch.tensor([4])).next_token == 4


def test_tree_masks_and_depths():
    parents = torch.tensor([-1, -1, 0, 2])
    mask = ancestor_mask(parents)
    assert mask.tolist()[4] == [True, True, False, True, True]
    assert mask.tolist()[2] == [True, False, True, False, False]
    assert node_depths(parents).tolist() == [1, 1, 2, 3]
    assert path_to(parents, 3) == [0, 2, 3]
    parents_s, ordered = static_tree_parents(((0, 1), (0,), (1,), (0, 0)))
    assert ordered == [(0,), (1,), (0, 0), (0, 1)] and parents_s == [-1, -1, 0, 0]


def test_ngram_lookup_prefers_longest_latest_match():
    seq = torch.tensor([1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 2, 3])
    assert lookup(seq, k=2, max_n=3, min_n=1).tolist() == [7, 8]
    assert lookup(torch.tensor([4, 5, 6]), k=2, max_n=3, min_n=1).tolist() == []


def test_ngram_lookup_continues_a_loop_past_the_sequence_end():
    # "o que o que o que": the latest match is 2 tokens back, so its continuation repeats with period 2
    loop = torch.tensor([5, 1, 2, 1, 2, 1, 2])
    assert lookup(loop, k=5, max_n=16, min_n=1).tolist() == [1, 2, 1, 2, 1]
    assert continuation(torch.tensor([3, 4, 7, 3, 4]), 2, 4).tolist() == [7, 3, 4, 7]
    assert continuation(torch.tensor([3, 4, 7, 3, 4]), 2, 0).tolist() == []
