"""Draft length chosen per step: the maths of the policy, its calibration, the measured costs, and greedy identity
of every drafter under it."""
from __future__ import annotations

import pytest
import torch

from draftsmith.serve.core.costs import VerifyCosts, measure_verify_costs, use_verify_costs, verify_costs_for
from draftsmith.serve.decoding import plain_generate, speculative_generate
from draftsmith.serve.drafters import DrafterSpecError, build_drafter
from draftsmith.serve.drafters.calibration import Calibration, generation_factor, scale_odds
from draftsmith.serve.drafters.length import (ExpectedGain, FixedLength, LastDraft, MinConfidence, build_policy,
                                              matched_prefix)
from draftsmith.serve.drafters.length_model import best_length, expected_tokens
from draftsmith.serve.methods.ngram.drafter import (GENERATION_WEIGHT as NGRAM_GENERATION_WEIGHT,
                                             LOCAL_WEIGHT as NGRAM_LOCAL_WEIGHT)
from draftsmith.serve.methods.ngram.drafter import Match, NgramDrafter, longest_match, match_signal
from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.core.target import load_target

# a CPU-like cost curve: one or two drafts nearly free, then a jump (what SmolLM2 on one core measured)
CPU = VerifyCosts(ratios={0: 1.0, 1: 1.05, 2: 1.1, 3: 1.6, 5: 1.65, 8: 2.0}, step_seconds=0.1)
FLAT = VerifyCosts(ratios={0: 1.0, 16: 1.0}, step_seconds=0.01)  # a GPU far from compute-bound
# SmolLM2-135M, fp32, one thread: what a held-out eval fitted on the earlier development VM (1, 2, 5, 8, 16 drafts)
DEMO_CPU = VerifyCosts(ratios={0: 1.0, 1: 1.24, 2: 1.38, 5: 1.62, 8: 1.78, 16: 2.33}, step_seconds=0.05)


def test_expected_tokens_and_best_length():
    assert expected_tokens([]) == [1.0]
    assert expected_tokens([0.5, 0.5]) == pytest.approx([1.0, 1.5, 1.75])
    # two nearly free drafts pay even when unsure; the third costs half a step and needs a likely chain
    n, rate = best_length([0.5, 0.5, 0.5], CPU.ratio)
    assert n == 2 and rate == pytest.approx(1.75 / 1.1)
    assert best_length([0.95] * 8, CPU.ratio)[0] == 8
    assert best_length([0.02, 0.9], CPU.ratio)[0] == 0  # nothing is worth verifying
    assert best_length([0.3] * 8, FLAT.ratio)[0] == 8  # verification is free: draft all


def test_verify_costs_interpolate_and_never_go_below_a_step():
    costs = VerifyCosts.from_forward_seconds({1: 0.1, 2: 0.11, 5: 0.16})
    assert costs.ratio(0) == 1.0 and costs.ratio(1) == pytest.approx(1.1)
    assert costs.ratio(2) == pytest.approx(1.1 + 0.5 / 3 * 1) and costs.ratio(4) == pytest.approx(1.6)
    assert VerifyCosts(ratios={0: 1.0, 4: 0.8}).ratio(3) == 1.0


def test_measured_costs_are_monotone_and_cached(tiny_target_dir):
    target = load_target(tiny_target_dir)
    costs = measure_verify_costs(target.model, sizes=(1, 2, 4), repeats=1, context_tokens=16)
    assert sorted(costs.ratios) == [0, 1, 3] and costs.step_seconds > 0
    assert costs.ratios[0] == 1.0 and costs.ratios[1] <= costs.ratios[3]
    assert verify_costs_for(target.model) is verify_costs_for(target.model)


def test_calibration_learns_from_outcomes_and_forgets_slowly():
    cal = Calibration(prior_weight=2.0)
    assert cal.predict("k", 0.8) == pytest.approx(0.8)
    for _ in range(20):
        cal.update("k", False)
    assert cal.predict("k", 0.8) < 0.15
    assert cal.predict("other", 0.8) == pytest.approx(0.8)


def test_expected_gain_offers_until_the_rate_stops_improving():
    policy = ExpectedGain(CPU)
    policy.start(8)
    assert all(policy.offer(("sure", 0.97)) for _ in range(8)) and not policy.wants_more()
    policy.start(8)
    assert policy.offer(("unsure", 0.5)) and policy.offer(("unsure", 0.5))  # the two nearly free ones
    assert not policy.wants_more()  # the third would cost half a step for a 12% chance
    policy.start(8)
    assert not policy.offer(("hopeless", 0.01))
    policy.start(3)
    assert policy.choose([("sure", 0.97)] * 5) == 2  # a third costs half a step for 0.91 of a token
    free = ExpectedGain(FLAT)
    free.start(3)
    assert free.choose([("sure", 0.97)] * 5) == 3  # the cap


def test_observe_calibrates_the_keys_it_drafted():
    policy = ExpectedGain(VerifyCosts(ratios={0: 1.0, 1: 1.05, 2: 1.2, 3: 1.6}))
    for _ in range(30):  # the drafter claims 0.9 but its second draft is always wrong
        policy.start(5)
        assert policy.choose([("first", 0.9), ("second", 0.9), ("third", 0.9)]) >= 1
        policy.observe(1, 2)
    assert policy.accept_probability(("first", 0.9)) > 0.9
    assert policy.accept_probability(("second", 0.9)) < 0.2
    assert policy.accept_probability(("third", 0.9)) == pytest.approx(0.9)  # never checked
    policy.start(5)
    assert policy.choose([("first", 0.9), ("second", 0.9), ("third", 0.9)]) == 1


def test_the_current_generation_moves_the_estimate_fast_and_is_forgotten_at_the_next():
    policy = ExpectedGain(VerifyCosts(ratios={0: 1.0, 1: 1.4}, step_seconds=0.1), local_weight=4)  # pays at 40%

    def draft(times: int, accepted: bool) -> None:
        for _ in range(times):
            policy.start(1)
            policy.choose([("match", 0.5)])
            policy.observe(int(accepted), 1)

    for _ in range(20):  # every generation so far: the key is right 80% of the time
        policy.new_context()
        draft(8, True)
        draft(2, False)
    policy.new_context()
    assert policy.accept_probability(("match", 0.5)) == pytest.approx(0.8, abs=0.05)
    policy.start(1)
    assert policy.choose([("match", 0.5)]) == 1
    draft(6, False)  # this generation's text: wrong six times in a row
    assert policy.accept_probability(("match", 0.5)) < 0.45
    assert policy.calibration[False].predict("match", 0.5) > 0.7  # the pooled estimate alone moved by a few percent
    policy.start(1)
    assert policy.choose([("match", 0.5)]) == 0  # this text's drafts are no longer worth a verify
    policy.new_context()  # the next generation starts from the pooled estimate
    assert policy.accept_probability(("match", 0.5)) > 0.7
    policy.local_weight = 0  # the current generation not used (a head's policy): the pooled estimate only
    draft(6, False)
    assert policy.accept_probability(("match", 0.5)) == pytest.approx(policy.calibration[False].predict("match", 0.5))
    assert policy.accept_probability(("match", 0.5)) > 0.6


def test_odds_scaling_and_the_generation_factor():
    assert scale_odds(0.5, 1.0) == pytest.approx(0.5)
    assert scale_odds(0.5, 3.0) == pytest.approx(0.75)
    assert scale_odds(0.8, 0.25) == pytest.approx(0.5)
    assert 0.0 < scale_odds(0.99, 1e-6) < scale_odds(0.99, 1e-3) < 0.99 < scale_odds(0.99, 1e3) < 1.0
    assert scale_odds(0.0, 5.0) == 0.0 and scale_odds(1.0, 0.2) == 1.0
    assert generation_factor(0, 0, 0, 2.0) == 1.0  # no drafts yet: the pooled estimates as they are
    assert generation_factor(2, 2.0, 4, 2.0) == pytest.approx(1.0)  # as many accepted as expected
    # three drafts expected 80% accepted (2.4), none were: (0 + 2) / 4.4 accepted, (3 + 2) / 2.6 rejected
    assert generation_factor(0, 2.4, 3, 2.0) == pytest.approx((2 / 4.4) / (5 / 2.6))
    assert generation_factor(4, 2.0, 4, 2.0) == pytest.approx(1.5 / (2 / 4))


def test_a_generation_whose_drafts_fail_lowers_the_estimate_of_keys_it_has_not_tried():
    """The generation's scale carries what some keys' drafts said to the others: after a few failed drafts of other
    matches, a key never drafted in this text is no longer trusted at its pooled rate, only with the scale on; what
    the policy declined to draft does not move it."""
    keys = ("two", "three", "four", "five", "six", "seven")

    def trained(weight: float) -> ExpectedGain:
        policy = ExpectedGain(VerifyCosts(ratios={0: 1.0, 1: 1.4}, step_seconds=0.1), local_weight=4,
                              generation_weight=weight)
        for _ in range(10):  # earlier generations: every key right 80% of the time
            policy.new_context()
            for key in keys:
                for accepted in (True, True, True, True, False):
                    policy.start(1)
                    policy.choose([(key, 0.5)])
                    policy.observe(int(accepted), 1)
        policy.new_context()
        return policy

    def fail(policy: ExpectedGain, key: str) -> int:
        policy.start(1)
        drafted = policy.choose([(key, 0.5)])
        policy.observe(0, 1)
        return drafted

    for weight, moved in ((0.0, False), (2.0, True)):
        policy = trained(weight)
        untried = policy.accept_probability(("seven", 0.5))
        assert untried == pytest.approx(0.8, abs=0.05)
        assert all(fail(policy, key) == 1 for key in keys[:4])  # this text: four drafted matches, all wrong
        after = policy.accept_probability(("seven", 0.5))
        if moved:
            assert after < 0.4  # from 0.78: 0.65, 0.55 and 0.46 after one, two and three
            policy.start(1)
            assert policy.choose([("seven", 0.5)]) == 0  # no longer worth a verify at V(1) = 1.4
        else:
            assert after == pytest.approx(untried, abs=0.02)
        policy.new_context()  # the next generation starts from the pooled estimates again
        assert policy.accept_probability(("seven", 0.5)) == pytest.approx(0.8, abs=0.05)

    policy = trained(2.0)
    for _ in range(5):  # a weak key, declined each time and wrong each time: the scale does not move
        policy.start(1)
        assert policy.choose([("weak", 0.05)]) == 0
        policy.observe(0, 1)
    assert policy.generation[False] == [0.0, 0.0, 0.0]
    assert policy.accept_probability(("seven", 0.5)) == pytest.approx(0.8, abs=0.05)


def test_every_drafter_starts_a_new_context_at_begin(tiny_target_dir, tiny_target_factory, tmp_path):
    """Every drafter's `begin` forgets the last generation's own estimates; the n-gram drafter (alone or in a hybrid)
    keeps them, the heads do not."""
    target = load_target(tiny_target_dir)
    folders = _folders(target, tmp_path)
    for spec in ["ngram", f"model:{tiny_target_factory('llama', seed=1)}", folders["eagle3"], folders["medusa"],
                 f"hybrid:{folders['eagle3']}"]:
        drafter = build_drafter(spec, target)
        ngram = drafter.ngram if drafter.kind == "hybrid" else drafter if drafter.kind == "ngram" else None
        policies = {id(p): p for p in (drafter.policy, ngram and ngram.policy) if p is not None}.values()
        for policy in policies:
            assert policy.local_weight == (NGRAM_LOCAL_WEIGHT if ngram and policy is ngram.policy else 0), spec
            # the n-gram drafter scales its estimates by the generation's drafts, alone or as a hybrid's side
            assert policy.generation_weight == (NGRAM_GENERATION_WEIGHT if ngram and policy is ngram.policy else 0), \
                spec
            policy.local[False].update("stale", False)
        speculative_generate(target, drafter, torch.tensor([[1, 2, 3, 1, 2]]), max_new_tokens=2)
        assert all("stale" not in policy.local[False].counts for policy in policies), spec


def test_a_drafter_that_does_not_pay_is_skipped_but_retried_ever_less_often():
    policy = ExpectedGain(CPU, overhead_cost=0.2, explore=4, max_explore=8, trial=1)
    policy.plain_seconds = 0.1

    def run(cycles: int) -> list[bool]:
        tries = []
        for _ in range(cycles):
            tries.append(policy.should_draft())
            if tries[-1] and policy.rate < 1.0:  # a retry that yields a token in two steps' time
                policy.record_cycle(0.2, 1, worked=True)
        return tries

    policy.rate = 0.8
    assert [i for i, t in enumerate(run(4 + 8 + 8)) if t] == [3, 11, 19]  # after 4 paused cycles, then 8 (cap)
    policy.rate = 1.3
    assert policy.should_draft()  # paying again: drafts every cycle
    policy.rate = 0.8  # ... but one cycle does not forgive the back-off: the next retry comes after 8 still
    assert run(8) == [False] * 7 + [True]
    policy.rate = 1.3
    assert all(policy.should_draft() for _ in range(8))  # paid for as long as it last waited: forgiven
    policy.rate = 0.8
    assert run(4) == [False, False, False, True]


def test_a_retry_is_a_trial_of_several_cycles_judged_together():
    policy = ExpectedGain(CPU, overhead_cost=0.2, explore=2, trial=2)
    policy.plain_seconds = 0.1
    policy.rate = 0.7
    assert [policy.should_draft() for _ in range(2)] == [False, True]  # the retry opens a 2-cycle trial
    policy.record_cycle(0.1, 1, worked=True)  # its first draft rejected: one token in a step's time ...
    assert policy.rate < 1.0 and policy.should_draft()  # ... but the trial goes on
    policy.record_cycle(0.1, 3, worked=True)  # 3 tokens in a step: 4 in 2 steps together
    assert policy.rate == pytest.approx(2.0) and policy.should_draft()  # resumed at the trial's rate
    policy.record_cycle(0.1, 1, worked=True)  # an ordinary cycle moves the smoothed rate only
    assert policy.rate == pytest.approx(2.0 + 0.1 * (1.0 - 2.0))


def test_a_trial_that_does_not_pay_pauses_the_drafter_at_its_rate():
    policy = ExpectedGain(CPU, overhead_cost=0.2, explore=2, trial=2)
    policy.plain_seconds = 0.1
    policy.rate = 0.7
    assert [policy.should_draft() for _ in range(2)] == [False, True]
    policy.record_cycle(0.25, 2, worked=True)
    assert policy.should_draft()
    policy.record_cycle(0.15, 1, worked=True)  # 3 tokens in 4 steps' time: 0.75 per step
    assert policy.rate == pytest.approx(0.75)
    assert [policy.should_draft() for _ in range(4)] == [False, False, False, True]  # the wait doubled
    active = ExpectedGain(CPU, overhead_cost=0.2, trial=2)  # a drafter in use, probed (a hybrid's head) ...
    active.plain_seconds, active.rate = 0.1, 1.4
    active.probe()
    for seconds in (0.2, 0.2):  # ... that yields 1 token in 2 steps' time: paused
        assert active.should_draft()
        active.record_cycle(seconds, 1, worked=True)
    assert active.rate == pytest.approx(0.5) and not active.should_draft()


def test_a_new_request_starts_neutral_a_paused_drafter_is_tried_at_once():
    policy = ExpectedGain(CPU, overhead_cost=0.2, explore=2, max_explore=16, trial=2)
    policy.plain_seconds, policy.rate = 0.1, 0.6
    for _ in range(2 + 4 + 8):  # paused through two failed retries: the wait has grown to 8
        if policy.should_draft():
            policy.record_cycle(0.2, 1, worked=True)
    assert policy.rate < 1.0 and policy._wait == 8
    policy.new_context()  # the next request (a drafter's `begin`)
    assert policy.should_draft() and policy._wait == 2  # on trial at once, the back-off forgotten
    policy.record_cycle(0.1, 3, worked=True)
    assert policy.should_draft()
    policy.record_cycle(0.1, 3, worked=True)  # 6 tokens in 2 steps: it pays on this request
    assert policy.rate == pytest.approx(3.0) and policy.should_draft()
    paying = ExpectedGain(CPU, overhead_cost=0.2, trial=2)
    paying.rate = 1.5
    paying.new_context()
    assert paying._trial_left == 0  # a drafter that pays is not put on trial
    negligible = ExpectedGain(CPU)
    negligible.rate = 0.5
    negligible.new_context()
    assert negligible._trial_left == 0  # nor one whose work costs nothing (it always runs)


def test_the_rate_is_realized_wall_time_against_a_plain_cycle():
    policy = ExpectedGain(CPU, overhead_cost=0.2)  # step_seconds 0.1 stands in for a plain cycle until one is timed
    policy.record_cycle(0.2, 3, worked=True)  # 3 tokens in two steps' time: 1.5 tokens per step
    assert policy.rate == pytest.approx(1.0 + 0.1 * 0.5)
    policy.record_cycle(0.05, 1, worked=False)  # a plain cycle here takes 0.05 s
    assert policy.plain_seconds == 0.05
    rate = policy.rate
    policy.record_cycle(0.2, 3, worked=True)  # now four plain steps' time: 0.75 tokens per step
    assert policy.rate == pytest.approx(rate + 0.1 * (0.75 - rate))
    policy.record_cycle(0.07, 1, worked=False)
    assert policy.plain_seconds == pytest.approx(0.05 + 0.1 * 0.02)
    for _ in range(40):  # a drafter whose cycles cost more than they yield ends up paused
        policy.record_cycle(0.08, 1, worked=True)
    assert policy.rate < 1.0 and not policy.should_draft()


def test_last_draft_times_the_cycles_it_was_asked_for():
    seen = []

    class Recorder(FixedLength):
        def record_cycle(self, seconds, tokens, *, worked):
            seen.append((tokens, worked, seconds >= 0))

    policy, last = Recorder(), LastDraft()
    last.settle(policy, torch.tensor([1, 2]))  # never opened (a hybrid's other side drafted): not timed
    policy.should_draft = lambda: False  # paused
    assert not last.open(policy)
    last.settle(policy, torch.tensor([3]))
    assert last.open(policy, always=True)  # a tree drafts whatever the length policy says
    last.tokens = [4, 5]
    last.settle(policy, torch.tensor([4, 5, 6]))
    policy.should_draft = lambda: True
    assert last.open(policy)
    last.verified = False  # proposed but not verified: not this drafter's cycle
    last.settle(policy, torch.tensor([7]))
    assert seen == [(1, False, True), (3, True, True)]
    free = ExpectedGain(CPU, overhead_cost=0.001)  # an n-gram lookup: always worth looking
    free.rate = 0.5
    assert all(free.should_draft() for _ in range(8))


def test_matched_prefix_and_last_draft():
    assert matched_prefix([5, 6, 7], [5, 6, 9, 1]) == 2 and matched_prefix([], [1]) == 0
    policy = ExpectedGain(CPU)
    policy.start(4)
    policy.choose([("a", 0.9), ("b", 0.9)])
    last = LastDraft(tokens=[3, 4])
    last.settle(policy, torch.tensor([3, 8]))  # first accepted, second rejected
    assert last.tokens is None
    assert policy.calibration[False].counts == {"a": [1.0, 1.0], "b": [0.0, 1.0]}


def test_build_policy():
    assert isinstance(build_policy("fixed"), FixedLength)
    assert isinstance(build_policy("auto", costs=CPU), ExpectedGain)
    assert isinstance(build_policy("auto", costs=CPU, min_confidence=0.3), MinConfidence)
    with pytest.raises(DraftsmithError, match="length must be one of auto, fixed"):
        build_policy("sometimes", costs=CPU)
    with pytest.raises(DraftsmithError, match=r"min_confidence must be in \[0, 1\)"):
        build_policy("auto", costs=CPU, min_confidence=1.2)


def test_ngram_longest_match_and_its_signal():
    seq = torch.tensor([7, 1, 2, 3, 9, 4, 2, 3, 8, 6, 1, 2, 3])
    match = longest_match(seq, min_n=2, max_n=16)
    assert match.length == 3 and seq[match.start] == 9  # [1, 2, 3] beats the more recent [4, 2, 3] -> 8
    capped = longest_match(seq, min_n=2, max_n=2)
    assert capped.length == 2 and seq[capped.start] == 8  # lengths capped at 2: the most recent wins
    assert longest_match(torch.tensor([1, 2, 3]), min_n=1, max_n=4) is None
    assert match.agreement == "single" and capped.agreement == "major"  # [2, 3] was followed by 9 and by 8
    assert match_signal(match, 0)[1] < match_signal(Match(0, 12), 0)[1]  # longer matches are likelier copies
    assert match_signal(capped, 0)[1] < match_signal(Match(0, 2, "agree"), 0)[1]
    assert match_signal(match, 5)[0] == match_signal(match, 3)[0]  # later positions share one key


def test_ngram_drafts_past_k_only_while_copying():
    """After a proposal right on every token it was checked on, the text is copying and the next cycle may draft
    past the decoder's K; a wrong first token ends it; reach="always" drafts past K in any cycle."""
    ids = torch.tensor([5, 1, 2, 3, 4, 6, 7, 1, 2])
    flat = VerifyCosts(ratios={0: 1.0, 16: 1.0}, step_seconds=0.01)
    drafter = NgramDrafter(policy=ExpectedGain(flat))
    assert drafter.draft_cap(3) == 16
    drafter.begin(ids[:-1], ids[1:], {})
    assert drafter.propose(16).tokens.tolist() == [3, 4, 6] and not drafter.copying  # not known to copy yet: K
    drafter.commit(torch.tensor([3, 4, 6, 7]), {})  # all three accepted and the bonus token continues the copy
    assert drafter.copying and len(drafter.propose(16)) > 3
    drafter.commit(torch.tensor([9]), {})  # the first draft rejected
    assert not drafter.copying
    drafter.reach = "always"
    drafter.begin(ids[:-1], ids[1:], {})
    assert len(drafter.propose(16)) > 3


PROMPTS = ["hello hello hello world", "abcabcabcabc", "def f(x):\n    return x", "The quick brown fox"]


def _folders(target, tmp_path):
    from draftsmith.serve.methods.eagle3.head import eagle3_config
    from draftsmith.serve.drafters.folder import build_head, save_drafter
    from draftsmith.serve.methods.medusa.head import medusa_config

    out = {}
    for cfg in (eagle3_config(target, aux_layer_ids=[0, 1, 1]), medusa_config(target, num_heads=3)):
        torch.manual_seed(0)
        out[cfg.method] = str(save_drafter(build_head(cfg), cfg, tmp_path / cfg.method))
    return out


def test_greedy_identity_with_per_step_length(tiny_target_dir, tiny_target_factory, tmp_path):
    """Every drafter with its length chosen per step (the default of a spec) stays token-identical to plain
    greedy decoding, and so does the hybrid, chain or tree."""
    from draftsmith.serve.tree import TreeSpec

    target = load_target(tiny_target_dir)
    folders = _folders(target, tmp_path)
    specs = ["ngram", f"model:{tiny_target_factory('llama', seed=1)}", folders["eagle3"], folders["medusa"],
             f"hybrid:{folders['eagle3']}", f"hybrid:{folders['medusa']}", f"hybrid:{folders['eagle3']}:length=fixed"]
    for spec in specs:
        drafter = build_drafter(spec, target)
        assert spec.endswith("length=fixed") or isinstance(drafter.policy, ExpectedGain), spec
        for text in PROMPTS:
            ids = torch.tensor([target.tokenizer.encode(text)])
            ref = plain_generate(target, ids, max_new_tokens=30, eos_token_ids=())
            for k, tree in ((3, None), (6, None), (4, TreeSpec(depth=3, top_k=2, total_tokens=6))):
                if tree is not None and drafter.kind not in ("hybrid", "eagle3", "medusa"):
                    continue
                got = speculative_generate(target, drafter, ids, max_new_tokens=30, k=k, eos_token_ids=(), tree=tree)
                assert got.output_ids == ref.output_ids, (spec, k, tree, text)
                # K caps every drafter's cycles but the n-gram drafter's (and a hybrid's n-gram side), which may draft
                # a copied passage up to max_k
                cap = max(k, 16) if drafter.kind in ("ngram", "hybrid") and not spec.endswith("fixed") else k
                assert drafter.draft_cap(k) == cap and max(got.stats.drafted_per_cycle) <= cap


def test_ngram_drafts_a_copied_passage_past_k(tiny_target_dir):
    """A per-step n-gram drafter copies a repeated passage in drafts longer than K (up to max_k), stays exact,
    and needs fewer target forwards for it; `max_k=0` and a fixed length keep it to K (the hybrid's head keeping K:
    tests/test_hybrid.py)."""
    target = load_target(tiny_target_dir)
    # the default target's measured curve, fixed: the tiny model's own timings, measured while other tests run,
    # swing enough to make one extra draft look as dear as eight
    use_verify_costs(target.model, DEMO_CPU)
    answer = plain_generate(target, torch.tensor([list(range(40, 80))]), max_new_tokens=40, eos_token_ids=())
    context = torch.tensor([answer.output_ids * 3 + answer.output_ids[:2]])  # a passage the target goes on copying
    ref = plain_generate(target, context, max_new_tokens=40, eos_token_ids=())
    runs = {}
    for spec in ("ngram", "ngram:max_k=0", "ngram:length=fixed", "ngram:max_k=8"):
        got = speculative_generate(target, build_drafter(spec, target), context, max_new_tokens=40, k=3,
                                   eos_token_ids=())
        assert got.output_ids == ref.output_ids, spec
        runs[spec] = got.stats
    assert max(runs["ngram"].drafted_per_cycle) > 3 and 3 < max(runs["ngram:max_k=8"].drafted_per_cycle) <= 8
    assert max(runs["ngram:max_k=0"].drafted_per_cycle) <= 3 and max(runs["ngram:length=fixed"].drafted_per_cycle) <= 3
    assert runs["ngram"].target_forwards < runs["ngram:max_k=0"].target_forwards
    with pytest.raises(DrafterSpecError, match="max_k >= 0"):
        build_drafter("ngram:max_k=-1", target)


def test_specs_take_a_length(tiny_target_dir, tmp_path):
    target = load_target(tiny_target_dir)
    folders = _folders(target, tmp_path)
    assert isinstance(build_drafter("ngram:length=fixed", target).policy, FixedLength)
    assert isinstance(build_drafter("ngram:max_n=8", target).policy, ExpectedGain)
    assert isinstance(build_drafter(f"{folders['eagle3']}:length=fixed", target).policy, FixedLength)
    assert isinstance(build_drafter(f"{folders['medusa']}:min_confidence=0.4", target).policy, MinConfidence)
    with pytest.raises(DrafterSpecError, match="length must be one of"):
        build_drafter("ngram:length=often", target)
    with pytest.raises(DraftsmithError, match="length must be one of"):
        build_drafter(f"{folders['eagle3']}:length=often", target)
    with pytest.raises(DrafterSpecError, match="ngram options take integers"):
        build_drafter("ngram:max_n=many", target)


def test_paused_drafters_stay_exact_and_in_step(tiny_target_dir, tmp_path):
    """A drafter the policy pauses does no work those cycles and catches up on the skipped text when it next
    drafts: outputs stay identical, and a draft model equal to the target (which must then be right every time)
    still has every draft accepted after pauses."""
    import itertools

    target = load_target(tiny_target_dir)
    folders = _folders(target, tmp_path)
    for spec in (f"model:{tiny_target_dir}", folders["eagle3"], folders["medusa"]):
        drafter = build_drafter(spec, target)
        drafter.policy = FixedLength()  # K whenever it drafts; paused two cycles in three
        pattern = itertools.cycle([False, False, True])
        drafter.policy.should_draft = lambda: next(pattern)
        for text in PROMPTS:
            ids = torch.tensor([target.tokenizer.encode(text)])
            ref = plain_generate(target, ids, max_new_tokens=30, eos_token_ids=())
            got = speculative_generate(target, drafter, ids, max_new_tokens=30, k=3, eos_token_ids=())
            assert got.output_ids == ref.output_ids, (spec, text)
            drafted = got.stats.drafted_per_cycle
            assert 0 in drafted and max(drafted) > 0, spec  # paused cycles and drafting ones
            if spec.startswith("model:"):
                assert all(a == d for a, d in zip(got.stats.accepted_per_cycle, drafted)), text


def test_the_plain_cycle_is_retimed_while_the_drafter_works():
    """A plain step timed when the machine was slow must not keep a drafter whose cycles no longer pay running."""
    def run(policy: ExpectedGain, cycles: int = 200) -> list[bool]:
        policy.plain_seconds, policy.rate = 0.068, 1.2  # timed in a slow minute; the drafter was paying then
        worked = []
        for _ in range(cycles):
            worked.append(policy.should_draft())
            # its work, no draft kept: one token in a plain step (0.055 s) plus 4 ms
            policy.record_cycle(0.059 if worked[-1] else 0.055, 1, worked=worked[-1])
        return worked

    stale = ExpectedGain(CPU, overhead_cost=0.07, refresh=0)
    assert all(run(stale))  # 0.068 / 0.059: the work looks like a 1.15x speedup for ever
    fresh = ExpectedGain(CPU, overhead_cost=0.07)
    worked = run(fresh)  # re-timed after 32 working cycles, and again after 32 more: paused from then on ...
    assert worked[:32] == [True] * 32 and not worked[32] and not any(worked[65:73])
    assert sum(worked[100:]) <= 12  # ... but for trials (4 cycles), ever less often
    assert fresh.plain_seconds == pytest.approx(0.055, abs=0.002) and fresh.rate < 1.0
    paying = ExpectedGain(CPU, overhead_cost=0.07)  # a drafter that pays leaves one cycle in refresh + 1 plain
    paying.plain_seconds = 0.055
    tries = []
    for _ in range(66):
        tries.append(paying.should_draft())
        paying.record_cycle(0.07 if tries[-1] else 0.055, 2 if tries[-1] else 1, worked=tries[-1])
    assert [i for i, t in enumerate(tries) if not t] == [32, 65]
    ngram = ExpectedGain(CPU)  # negligible work: nothing to re-time against, it always drafts
    ngram.plain_seconds = 0.055
    for _ in range(40):
        assert ngram.should_draft()
        ngram.record_cycle(0.06, 1, worked=True)
