"""The batched speculative decoder: every row's greedy output equals plain decoding of its prompt, for every
drafter, chains and trees, every family; sampled rows keep the target's distribution and stay independent of
the rows beside them; rows join, leave, get cancelled and hit the context limit on their own."""
from __future__ import annotations

import pytest
import torch

from draftsmith.serve.batch.costs import BatchCosts, batch_bucket
from draftsmith.serve.batch.decoder import BatchDecoder, Job
from draftsmith.serve.core.costs import VerifyCosts
from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.core.target import load_target
from draftsmith.serve.decoding import plain_generate
from draftsmith.serve.drafters import build_drafter
from draftsmith.serve.drafters.base import Draft, Drafter
from draftsmith.serve.drafters.length import ExpectedGain
from draftsmith.serve.tree import TreeSpec
from tests.decoder_fixtures import AnswerTrees

MAX_NEW = 24
FLAT = VerifyCosts(ratios={0: 1.0, 8: 1.2})  # drafting nearly free: the auto policies draft (no timing involved)


@pytest.fixture(scope="module")
def target(tiny_target_dir):
    return load_target(tiny_target_dir)


def random_prompts(n: int, *, seed: int = 0, longest: int = 60) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, longest, (n,), generator=g).tolist()
    return [torch.randint(0, 256, (length,), generator=g).tolist() for length in lengths]


def plain(target, prompts, max_new=MAX_NEW):
    return [plain_generate(target, torch.tensor([p]), max_new_tokens=max_new, eos_token_ids=()).output_ids
            for p in prompts]


def batched(target, drafter, prompts, *, slots, k=4, tree=None, max_new=MAX_NEW, costs=False, **job):
    decoder = BatchDecoder(target, drafter, slots=slots, k=k, tree=tree, costs=costs)
    for i, prompt in enumerate(prompts):
        decoder.add(Job(i, prompt, max_new_tokens=max_new, eos_token_ids=(), **job))
    return decoder.run()


def head_drafter(target, method: str, *, auto: bool = False):
    from draftsmith.serve.methods.eagle1.head import eagle1_config
    from draftsmith.serve.methods.eagle3.head import eagle3_config
    from draftsmith.serve.drafters.folder import build_head, make_drafter
    from draftsmith.serve.methods.dflash.head import dflash_config
    from draftsmith.serve.methods.medusa.head import medusa_config
    from draftsmith.serve.methods.peagle.head import peagle_config

    torch.manual_seed(5)
    config = {"eagle1": lambda: eagle1_config(target), "eagle3": lambda: eagle3_config(target, aux_layer_ids=[0, 1, 1]),
              "medusa": lambda: medusa_config(target, num_heads=3),
              "dflash": lambda: dflash_config(target, aux_layer_ids=[0, 1], block_size=4),
              "peagle": lambda: peagle_config(target, depths=4, aux_layer_ids=[0, 1, 1], draft_vocab_size=200)}[method]()
    head = build_head(config)
    if method == "medusa":
        head.init_from_target(target.model.get_output_embeddings().weight)  # head 0 agrees with the target often
    drafter = make_drafter(head, target, check=False)
    if auto:
        drafter.policy = ExpectedGain(FLAT)
    return drafter


def drafter_for(spec: str, target, tiny_target_factory):
    from draftsmith.serve.methods.hybrid.drafter import HybridDrafter
    from draftsmith.serve.methods.ngram.drafter import NgramDrafter

    if spec == "plain":
        return None
    if spec == "model":
        return build_drafter(f"model:{tiny_target_factory('llama', seed=1)}", target)
    if spec in ("eagle1", "eagle3", "medusa", "dflash", "peagle"):
        return head_drafter(target, spec)
    if spec == "eagle3-auto":
        return head_drafter(target, "eagle3", auto=True)
    if spec.startswith("hybrid"):  # hybrid (EAGLE-3), hybrid-dflash, hybrid-peagle: the n-gram drafter beside a head
        head = spec.partition("-")[2] or "eagle3"
        return HybridDrafter(head_drafter(target, head, auto=True), NgramDrafter(min_n=1, policy=ExpectedGain(FLAT)))
    return build_drafter(spec, target)


@pytest.mark.parametrize("spec", ["plain", "ngram", "oracle", "model", "eagle1", "eagle3", "eagle3-auto", "medusa",
                                  "dflash", "peagle", "hybrid", "hybrid-dflash", "hybrid-peagle"])
def test_greedy_rows_equal_plain_decoding_at_every_batch(target, tiny_target_factory, spec):
    prompts = random_prompts(9)
    expected = plain(target, prompts)
    drafter = drafter_for(spec, target, tiny_target_factory)
    for slots in (1, 4, 16):  # one row at a time, slots refilled as rows end, every row at once
        done = batched(target, drafter, prompts, slots=slots)
        assert [f.result.output_ids for f in done] == expected, (spec, slots)
        assert all(f.reason == "length" for f in done)
        if spec == "oracle":
            assert min(f.result.stats.mu for f in done) > 3


@pytest.mark.parametrize("spec", ["eagle3", "medusa", "dflash", "peagle"])
def test_greedy_trees_equal_plain_decoding(target, spec):
    prompts = random_prompts(6, seed=1)
    expected = plain(target, prompts)
    tree = TreeSpec(depth=3, top_k=2, total_tokens=6) if spec == "eagle3" else \
        TreeSpec(static_choices=((0,), (1,), (0, 0), (0, 1), (0, 0, 0)))
    for slots in (1, 4):
        done = batched(target, head_drafter(target, spec), prompts, slots=slots, tree=tree)
        assert [f.result.output_ids for f in done] == expected, (spec, slots)


@pytest.mark.parametrize("rank0_first", [True, False])
def test_accepted_tree_paths_stay_exact_in_a_ragged_batch(target, rank0_first):
    prompts = random_prompts(7, seed=2)
    expected = plain(target, prompts)
    answers = {tuple(p): e for p, e in zip(prompts, expected)}
    done = batched(target, AnswerTrees(answers, rank0_first=rank0_first), prompts, slots=4, tree=TreeSpec())
    assert [f.result.output_ids for f in done] == expected
    assert min(f.result.stats.mu for f in done) > 2.0  # drafts really accepted, off the first column or not


def test_every_family_batched(tiny_target_factory, family):
    # gemma's sliding window is 64: prompts up to 60 tokens plus 40 new ones run past it
    fam = load_target(tiny_target_factory(family))
    prompts = random_prompts(5, seed=3)
    expected = plain(fam, prompts, max_new=40)
    answers = {tuple(p): e for p, e in zip(prompts, expected)}
    for drafter, tree in ((build_drafter("ngram", fam), None), (AnswerTrees(answers), TreeSpec())):
        done = batched(fam, drafter, prompts, slots=3, tree=tree, max_new=40)
        assert [f.result.output_ids for f in done] == expected, (family, drafter.kind)


def test_sliding_window_far_past_the_window_in_a_batch(tiny_target_factory):
    fam = load_target(tiny_target_factory("gemma", sliding_window=8))
    prompts = random_prompts(4, seed=4, longest=20)
    expected = plain(fam, prompts, max_new=40)
    answers = {tuple(p): e for p, e in zip(prompts, expected)}
    done = batched(fam, AnswerTrees(answers, rank0_first=False), prompts, slots=4, tree=TreeSpec(), max_new=40)
    assert [f.result.output_ids for f in done] == expected


def test_sampled_rows_do_not_depend_on_their_neighbours(target):
    """A seeded row draws the same tokens alone and in a batch whose other rows sample at other settings."""
    prompts = random_prompts(6, seed=5)
    settings = [dict(temperature=0.8, top_p=0.9), dict(temperature=1.0, top_k=20), dict(temperature=0.0),
                dict(temperature=0.5), dict(temperature=1.3, top_p=0.5), dict(temperature=0.9)]
    drafter = build_drafter("ngram", target)

    def run(indices, slots):
        decoder = BatchDecoder(target, drafter, slots=slots, k=3, costs=False)
        for i in indices:
            decoder.add(Job(i, prompts[i], max_new_tokens=MAX_NEW, eos_token_ids=(), seed=100 + i, **settings[i]))
        return {f.job.key: f.result.output_ids for f in decoder.run()}

    together = run(range(6), slots=6)
    for i in range(6):
        assert run([i], slots=1)[i] == together[i], settings[i]


@pytest.mark.parametrize("drafter_kind", ["model-sampled", "tree", "eagle3"])
def test_batched_sampling_matches_target_distribution(drafter_kind):
    from draftsmith.serve.methods.model.drafter import ModelDrafter
    from tests.decoder_fixtures import (PROMPT, SAMPLES, SETTINGS, STEPS, VOCAB, GreedyTreeDrafter, chi_square_p,
                                        exact_joint, sampling_target)
    from tests.tiny_models import tiny_model

    tgt = sampling_target()
    other = tiny_model("llama", vocab_size=VOCAB, seed=11, eos_token_id=None, pad_token_id=None)
    if drafter_kind == "eagle3":  # its rows' chains sampled together, one head forward per position
        drafter = head_drafter(tgt, "eagle3")
    else:
        drafter = ModelDrafter(other, tgt.tokenizer, target_vocab_size=VOCAB) if drafter_kind == "model-sampled" \
            else GreedyTreeDrafter(other, tree=True)
    settings = SETTINGS[0]
    decoder = BatchDecoder(tgt, drafter, slots=16, k=2, costs=False)
    torch.manual_seed(0)  # unseeded rows: the rejection sampler (seeded rows: tests/test_seeded_sampling.py)
    for i in range(SAMPLES):
        decoder.add(Job(i, PROMPT[0].tolist(), max_new_tokens=STEPS, eos_token_ids=(), **settings))
    done = decoder.run()
    counts: dict[tuple, int] = {}
    for f in done:
        counts[tuple(f.result.output_ids)] = counts.get(tuple(f.result.output_ids), 0) + 1
    assert sum(sum(f.result.stats.accepted_per_cycle) for f in done) > SAMPLES * 0.1
    assert chi_square_p(counts, exact_joint(tgt, settings), SAMPLES) > 1e-3


def test_rows_join_leave_and_get_cancelled(target):
    prompts = random_prompts(6, seed=6)
    expected = plain(target, prompts)
    decoder = BatchDecoder(target, build_drafter("oracle", target), slots=3, k=4, costs=False)
    streamed: dict[int, list[int]] = {i: [] for i in range(6)}
    for i in range(3):
        decoder.add(Job(i, prompts[i], max_new_tokens=MAX_NEW, eos_token_ids=(), on_tokens=streamed[i].extend))
    done = decoder.step() + decoder.step()  # a prefill, then one cycle
    assert decoder.cancel(1)
    for i in range(3, 6):  # join while the others run
        decoder.add(Job(i, prompts[i], max_new_tokens=MAX_NEW, eos_token_ids=(), on_tokens=streamed[i].extend))
    while decoder.busy:
        done += decoder.step()
    by_key = {f.job.key: f for f in done}
    assert by_key[1].reason == "cancelled" and expected[1][: len(by_key[1].result.output_ids)] == \
        by_key[1].result.output_ids
    for i in (0, 2, 3, 4, 5):
        assert by_key[i].result.output_ids == expected[i] and streamed[i] == expected[i]
    assert not decoder.cancel(99)


def test_a_row_at_the_context_limit_ends_alone(tiny_target_factory):
    small = load_target(tiny_target_factory("llama", max_position_embeddings=48))
    prompts = [random_prompts(1, seed=7, longest=10)[0], list(range(1, 41))]  # the second has 8 positions left
    decoder = BatchDecoder(small, build_drafter("oracle", small), slots=2, k=4, costs=False)
    for i, prompt in enumerate(prompts):
        decoder.add(Job(i, prompt, max_new_tokens=30, eos_token_ids=()))
    done = {f.job.key: f for f in decoder.run()}
    assert done[0].reason == "length" and len(done[0].result.output_ids) == 30
    assert done[1].reason == "context" and 40 + len(done[1].result.output_ids) <= 48 + 1
    reference = plain_generate(small, torch.tensor([prompts[1]]), max_new_tokens=len(done[1].result.output_ids),
                               eos_token_ids=()).output_ids
    assert done[1].result.output_ids == reference
    with pytest.raises(DraftsmithError, match="48 positions"):
        decoder.add(Job(2, list(range(60)), max_new_tokens=4))


def test_a_batch_the_memory_cannot_hold_is_refused_before_any_work(target, monkeypatch):
    import draftsmith.serve.core.slots as slots

    monkeypatch.setattr(slots, "available_bytes", lambda device: 10 * 2**20)
    decoder = BatchDecoder(target, None, slots=4096, costs=False)
    decoder.add(Job(0, [1, 2, 3], max_new_tokens=4000))
    with pytest.raises(DraftsmithError, match=r"use a batch of at most \d+ rows"):
        decoder.step()
    assert decoder.forwards == 0


def test_drafting_stops_where_the_batch_is_compute_bound(target):
    """With costs where n drafts cost n + 1 steps from 4 rows on, the n-gram drafter drafts at 1 row and not at 8."""
    def measure(bucket: int) -> VerifyCosts:
        if bucket == 1:
            return VerifyCosts(ratios={0: 1.0, 16: 1.3}, step_seconds=float("nan"))
        return VerifyCosts(ratios={0: 1.0, 1: 2.0, 16: 17.0}, step_seconds=float("nan"))

    start = [5, 6, 7, 8]
    prompt = start + plain(target, [start], max_new=40)[0]  # the target's own text: it goes on the same way
    drafted = {}
    for rows in (1, 8):
        done = batched(target, build_drafter("ngram", target), [prompt] * rows, slots=rows,
                       costs=BatchCosts(measure=measure))
        drafted[rows] = sum(sum(f.result.stats.drafted_per_cycle) for f in done)
    assert drafted[1] >= 10 and drafted[8] == 0
    assert [batch_bucket(n) for n in (1, 2, 3, 5, 16, 17)] == [1, 2, 4, 8, 16, 32]


def test_fork_shares_weights_not_state(target):
    drafter = head_drafter(target, "eagle3", auto=True)
    twin = drafter.fork()
    assert twin.head is drafter.head and twin.target is drafter.target and twin.embed is drafter.embed
    assert twin.policy is not drafter.policy and twin._cache is not drafter._cache
    assert [type(p) for p in twin.policies()] == [ExpectedGain]


def test_batch_width_keeps_the_best_expected_tokens_per_cost():
    from draftsmith.serve.batch.width import batch_width, cut

    cheap = lambda n: 1.0 + 0.1 * n  # noqa: E731  (a tenth of a step per draft, for the whole batch)
    steep = lambda n: 1.0 + 0.5 * n  # noqa: E731
    # one confident long chain, three rows with nothing: worth its width where drafts are cheap, not where steep
    assert batch_width([6, 0, 0, 0], [[0.95] * 6, [], [], []], cheap) == 6
    assert batch_width([6, 0, 0, 0], [[0.95] * 6, [], [], []], steep) == 0
    # one doubtful long chain among rows with nothing: not worth making every row pay for it
    assert batch_width([6, 0, 0, 0], [[0.3] * 6, [], [], []], cheap) == 0
    # a row that cannot be cut sets the least width; the others may use it for free
    assert batch_width([3, 8], [None, [0.2] * 8], steep) == 3
    draft = Draft(torch.tensor([1, 2, 3, 9]), parents=torch.tensor([-1, 0, 1, 0]))  # a chain of 3 and a leaf
    assert cut(draft, 3, 2).tokens.tolist() == [1, 2] and not cut(draft, 3, 2).is_tree
    assert cut(draft, 3, 4) is draft


def test_drafts_cut_to_the_batch_width_stay_exact(target, tiny_target_factory, monkeypatch):
    import draftsmith.serve.batch.decoder as decoder_module

    cuts = []
    real_cut = decoder_module.cut
    monkeypatch.setattr(decoder_module, "cut", lambda *a: cuts.append(a[2]) or real_cut(*a))
    costs = BatchCosts(measure=lambda b: VerifyCosts(ratios={0: 1.0, 1: 1.6, 16: 10.0}, step_seconds=float("nan")))
    prompts = random_prompts(8, seed=9)
    start = [5, 6, 7, 8]
    prompts[::2] = [start + plain(target, [start], max_new=40)[0]] * 4  # rows where the n-gram drafts far
    expected = plain(target, prompts)
    for spec in ("ngram", "hybrid", "eagle3-auto"):
        done = batched(target, drafter_for(spec, target, tiny_target_factory), prompts, slots=8, costs=costs)
        assert [f.result.output_ids for f in done] == expected, spec
    assert cuts  # some chains were cut back to the batch's width


def test_a_batch_whose_drafting_does_not_pay_stops_drafting(target):
    """Drafts that are never accepted and cost a forward's time each: the batch's gate pauses drafting."""
    import time as clock

    class Costly(Drafter):
        kind = "costly"

        def propose(self, k, *, temperature=0.0, generator=None, tree=None):
            clock.sleep(0.01)
            return Draft(torch.full((k,), 258, dtype=torch.long))

    costs = BatchCosts(measure=lambda b: VerifyCosts(ratios={0: 1.0, 16: 1.1}, step_seconds=0.002))
    done = batched(target, Costly(), random_prompts(4, seed=10), slots=4, costs=costs, max_new=60)
    drafted = [sum(1 for d in f.result.stats.drafted_per_cycle if d) for f in done]
    assert max(drafted) < 0.5 * len(done[0].result.stats.drafted_per_cycle)  # most cycles plain
    assert [f.result.output_ids for f in done] == plain(target, random_prompts(4, seed=10), max_new=60)


def test_expected_widest_row():
    from draftsmith.eval.batch_sweep import expected_widest

    ratio = lambda n: 1.0 + n  # noqa: E731
    assert expected_widest(ratio, [0, 0, 4, 4], 1) == 3.0  # the mean of 1 and 5
    assert expected_widest(ratio, [0, 0, 4, 4], 2) == 1 * 0.25 + 5 * 0.75  # the wider of two draws
    assert expected_widest(ratio, [], 8) == 1.0


@pytest.mark.parametrize("spec", ["medusa", "hybrid-medusa"])
def test_medusa_heads_run_once_per_cycle_for_the_whole_batch(target, tiny_target_factory, spec):
    """Batched drafting: one forward of the heads per cycle however many rows draft (it was one per row)."""
    drafter = drafter_for(spec, target, tiny_target_factory)
    heads = (drafter.head if spec.startswith("hybrid") else drafter).heads
    calls = []
    forward = heads.forward
    heads.forward = lambda x: calls.append(x.shape[0]) or forward(x)
    prompts = random_prompts(4, seed=6)
    decoder = BatchDecoder(target, drafter, slots=4, k=3)
    for i, prompt in enumerate(prompts):
        decoder.add(Job(i, prompt, max_new_tokens=MAX_NEW, eos_token_ids=()))
    done = decoder.run()
    assert [f.result.output_ids for f in done] == plain(target, prompts)
    assert max(calls) == 4 and len(calls) <= decoder.cycles < decoder.cycle_rows


def test_a_batched_catch_up_lets_each_row_see_its_own_columns_only():
    """The rows' catch-up masks (serve/drafters/eagle_rows.py): row 0 has 2 pairs in its cache and 1 to run, row 1
    none and 2; past 2 columns, then 2 of this catch-up."""
    from draftsmith.serve.drafters.eagle_rows import catch_up_masks

    allowed, visible = catch_up_masks(torch.tensor([2, 0]), torch.tensor([1, 2]), past=2, width=2)
    assert allowed.int().tolist() == [[[1, 1, 1, 0], [0, 0, 0, 1]],  # a padding query sees itself
                                      [[0, 0, 1, 0], [0, 0, 1, 1]]]  # no past: its own run, causal
    assert visible.int().tolist() == [[1, 1, 1, 0], [0, 0, 1, 1]]


@pytest.mark.parametrize("method", ["eagle1", "eagle3"])
def test_eagle_rows_draft_together_what_they_draft_alone(target, method, monkeypatch):
    """Batched drafting: the rows' catch-ups in one head forward and each draft position in one, with the chains
    (tokens, lengths, acceptance) each row drafts alone."""
    from draftsmith.serve.drafters.base import Drafter
    from draftsmith.serve.drafters.eagle_drafter import EagleDrafter

    prompts = random_prompts(5, seed=7)

    def run(drafter):
        calls = []
        forward = drafter.head.forward
        drafter.head.forward = lambda *a, **k: calls.append(a[0].shape[0]) or forward(*a, **k)
        decoder = BatchDecoder(target, drafter, slots=4, k=3)
        for i, prompt in enumerate(prompts):
            decoder.add(Job(i, prompt, max_new_tokens=MAX_NEW, eos_token_ids=()))
        done = decoder.run()
        drafter.head.forward = forward
        return done, calls, decoder

    together, batched_calls, decoder = run(head_drafter(target, method))
    monkeypatch.setattr(EagleDrafter, "propose_rows", classmethod(Drafter.propose_rows.__func__))
    alone, row_calls, _ = run(head_drafter(target, method))
    assert [f.result.output_ids for f in together] == [f.result.output_ids for f in alone] == plain(target, prompts)
    for a, b in zip(together, alone):
        assert a.result.stats.accepted_per_cycle == b.result.stats.accepted_per_cycle
        assert a.result.stats.drafted_per_cycle == b.result.stats.drafted_per_cycle
    assert max(batched_calls) == 4 and max(row_calls) == 1  # all rows in one forward, against one row each
    assert len(batched_calls) <= 3 * decoder.cycles  # a catch-up and two steps a cycle at most
    assert len(batched_calls) < len(row_calls)
