"""eval/stats.py and eval/cost_model.py on hand-made numbers."""
from __future__ import annotations

import math

import pytest

from draftsmith.eval import cost_model as cm
from draftsmith.eval import stats


def rec(out, forwards, seconds, accepted=None, drafted=None):
    return {"output_token_ids": list(out), "target_forwards": forwards, "seconds": seconds,
            "accepted_per_cycle": accepted, "drafted_per_cycle": drafted}


def test_mu_is_a_ratio_of_sums():
    records = [rec(range(10), 4, 1.0), rec(range(2), 2, 1.0)]
    assert stats.mu(records) == pytest.approx(12 / 6)
    assert math.isnan(stats.mu([]))


def test_acceptance_by_position_and_histogram():
    accepted = [0, 1, 3, 2, 3]  # K = 3
    # position 1: 5 cycles reached it, 4 passed; position 2: 4 reached, 3 passed; position 3: 3 reached, 2 passed
    assert stats.acceptance_by_position(accepted, 3) == pytest.approx([4 / 5, 3 / 4, 2 / 3])
    assert stats.accept_length_histogram(accepted, 3) == [1, 1, 1, 2]
    # with proposal counts: an empty draft is neither accepted nor rejected; a 1-token draft only counts at 1
    rates = stats.acceptance_by_position([0, 0, 1, 2], 2, drafted=[0, 2, 1, 2])
    assert rates == pytest.approx([2 / 3, 1 / 1])
    assert math.isnan(stats.acceptance_by_position([], 2)[0])
    with pytest.raises(ValueError):
        stats.acceptance_by_position([0, 1], 2, drafted=[1])


def test_speedup_spread_and_bootstrap():
    base = [rec(range(10), 10, 2.0), rec(range(10), 10, 4.0), rec(range(10), 10, 3.0)]
    fast = [rec(range(10), 5, 1.0), rec(range(10), 5, 1.0), rec(range(10), 5, 3.0)]
    assert stats.paired_speedups(base, fast) == pytest.approx([2.0, 4.0, 1.0])
    assert stats.speedup(base, fast) == pytest.approx(9.0 / 5.0)
    s = stats.speedup_spread(base, fast, samples=300)
    assert (s["min"], s["median"], s["max"], s["n"]) == (1.0, 2.0, 4.0, 3)
    assert 1.0 <= s["ci_low"] <= 9 / 5 <= s["ci_high"] <= 4.0
    # sampled runs of different lengths compare per-token times
    assert stats.speedup([rec(range(10), 10, 1.0)], [rec(range(20), 8, 1.0)]) == pytest.approx(2.0)


def test_exactness_and_first_mismatch():
    ref = [rec([1, 2, 3], 3, 1), rec([4, 5], 2, 1), rec([6], 1, 1)]
    cand = [rec([1, 2, 3], 1, 1), rec([4, 9], 1, 1), rec([6, 7], 1, 1)]
    assert stats.exactness(ref, cand) == {"identical": 1, "total": 3}
    assert stats.first_mismatch([1, 2, 3], [1, 2, 3]) is None
    assert stats.first_mismatch([4, 5], [4, 9]) == 1
    assert stats.first_mismatch([6], [6, 7]) == 1


def test_tokens_per_cycle_and_alpha_inverse():
    assert cm.tokens_per_cycle(0.0, 5) == 1.0
    assert cm.tokens_per_cycle(1.0, 5) == 6.0
    assert cm.tokens_per_cycle(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)
    for alpha in (0.1, 0.5, 0.8, 0.95):
        assert cm.alpha_from_mu(cm.tokens_per_cycle(alpha, 4), 4) == pytest.approx(alpha, abs=1e-6)
    assert cm.alpha_from_mu(0.9, 4) == 0.0 and cm.alpha_from_mu(7.0, 4) == 1.0


def test_verify_ratios_interpolate_and_extrapolate():
    ratios = cm.verify_ratios({1: 0.1, 2: 0.15, 5: 0.2, 9: 0.3})
    assert ratios == pytest.approx({0: 1.0, 1: 1.5, 4: 2.0, 8: 3.0})
    assert cm.verify_ratio_at(ratios, 4) == pytest.approx(2.0)
    assert cm.verify_ratio_at(ratios, 2) == pytest.approx(1.5 + 0.5 / 3)
    assert cm.verify_ratio_at(ratios, 12) == pytest.approx(4.0)  # slope of the last segment: 0.25 per K
    with pytest.raises(ValueError):
        cm.verify_ratios({2: 1.0})


def test_predicted_speedup_and_best_k_on_hand_numbers():
    # Leviathan et al.'s formula with verify ratio 1: alpha 0.8, K 4, c 0.05
    expected = (1 - 0.8 ** 5) / (0.2 * (4 * 0.05 + 1))
    assert cm.predicted_speedup_at(0.8, 4, 0.05, {0: 1.0, 8: 1.0}) == pytest.approx(expected)
    assert cm.predicted_speedup(3.0, 4, 0.05, 1.5) == pytest.approx(3.0 / 1.7)
    assert cm.draft_step_cost(2.0, 10, 4, 0.1) == pytest.approx(0.5)
    # verify cost flat to K=4 then steep: the best K stops where it turns steep
    ratios = {0: 1.0, 4: 1.2, 5: 3.0, 8: 6.0}
    best = cm.best_k(0.9, 0.01, ratios, range(1, 9))
    assert best["k"] == 4 and best["pays"]
    assert not cm.best_k(0.1, 0.5, ratios, range(1, 9))["pays"]  # poor drafter, costly steps: never pays
    block = cm.drafter_cost_model(k=4, c=0.05, ratios={0: 1.0, 8: 1.0}, mu_by_domain={"code": 3.0},
                                  measured_by_domain={"code": 2.0}, ks=[1, 2, 4, 8])
    code = block["domains"]["code"]
    assert code["predicted_speedup"] == pytest.approx(3.0 / 1.2) and code["measured_speedup"] == 2.0
    # cycles that drafted nothing cost one plain step, not K*c + verify_ratio(K)
    ratios = {0: 1.0, 4: 2.0}
    assert cm.mean_cycle_cost([0, 4], 0.1, ratios) == pytest.approx((1.0 + 0.4 + 2.0) / 2)
    # half the cycles draft nothing (1 token for 1 step), the others accept 3 of 4 (4 tokens for 2.4 steps)
    block = cm.drafter_cost_model(k=4, c=0.1, ratios=ratios, mu_by_domain={"x": 2.5}, measured_by_domain={},
                                  ks=[2, 4], cycles_by_domain={"x": ([0, 3], [0, 4])})
    x = block["domains"]["x"]
    assert x["empty_draft_share"] == 0.5 and cm.tokens_per_cycle(x["alpha"], 4) == pytest.approx(4.0)
    assert x["cycle_cost"] == pytest.approx(1.7) and x["predicted_speedup"] == pytest.approx(2.5 / 1.7)
    # the extrapolation reproduces the run's own K: (1 + 4) / (1 + 2.4) averaged over the two kinds of cycle
    assert x["predicted_speedup_by_k"][4] == pytest.approx((0.5 + 0.5 * 4) / (0.5 + 0.5 * 2.4))
    assert cm.predicted_speedup_at(0.5, 3, 0.1, ratios, empty_share=1.0) == pytest.approx(1.0)
    # alpha comes from the cycles that drafted all K: a cut-short last cycle does not lower it
    assert cm.drafting_cycles([4, 4, 1], [4, 4, 1], 4) == (0.0, 5.0)
    assert cm.drafting_cycles([0, 1, 0], [0, 2, 0], 4) == (pytest.approx(2 / 3), 2.0)
    assert cm.tokens_per_cycle(code["alpha"], 4) == pytest.approx(3.0)


def test_exactness_verdict_says_what_the_audit_found():
    assert stats.exactness_verdict({"identical": 4, "total": 4}) == "all identical"
    assert "not lossless" in stats.exactness_verdict({"identical": 3, "total": 4})  # no audit: nothing explained
    audit = {"rounding_flips": 1, "unexplained": 0, "dtype": "bfloat16", "reference_dtype": "float32"}
    flips = stats.exactness_verdict({"identical": 3, "total": 4, "audit": audit})
    assert flips.startswith("1 rounding flip:") and "no bug" in flips and "target.invariant=on" in flips
    bug = stats.exactness_verdict({"identical": 2, "total": 4, "audit": {**audit, "unexplained": 1}})
    assert bug.startswith("MISMATCH: 1 divergence unexplained by rounding (a bug), 1 rounding flip")


def test_decode_speedup_leaves_the_prefill_out():
    # plain: 10 tokens, 1.0 s of prefill, 0.9 s for the 9 decode steps; the drafter: same prefill, 0.3 s after it
    base = [{**rec(range(10), 10, 1.9), "decode_seconds": 0.9}]
    fast = [{**rec(range(10), 4, 1.3, accepted=[2, 2, 2]), "decode_seconds": 0.3}]
    assert stats.speedup(base, fast) == pytest.approx(1.9 / 1.3)
    assert stats.decode_speedup(base, fast) == pytest.approx(3.0)
    assert stats.decode_tokens_per_cycle(fast) == pytest.approx(9 / 3)
    # results saved before decode_seconds was recorded: unknown, not zero
    assert math.isnan(stats.decode_speedup([rec(range(10), 10, 1.9)], fast))


def test_decode_phase_efficiency_is_measured_over_predicted():
    from draftsmith.eval.cost_fit import decode_phase

    base = [{**rec(range(13), 13, 2.2), "decode_seconds": 1.2}]  # 12 decode tokens at 0.1 s
    oracle = [{**rec(range(13), 3, 1.4, accepted=[5, 5]), "decode_seconds": 0.4}]  # 2 cycles of 6 tokens
    got = decode_phase(base, oracle, cycle_cost=1.5)  # a 6-token verify costs 1.5 steps
    assert got["predicted_decode_speedup"] == pytest.approx(6 / 1.5)
    assert got["measured_decode_speedup"] == pytest.approx(3.0)
    assert got["engine_efficiency"] == pytest.approx(3.0 / 4.0)
