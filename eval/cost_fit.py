"""Fitting the cost model to one run: c per drafter from its draft time, the verify ratios from the measured
forward times, then predicted against measured speedup and the best K per domain.

A pure function of the records and the forward timings, so a saved OUT.json can be re-fitted (`refit`).
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from draftsmith.eval import cost_model as cm
from draftsmith.eval import stats
from draftsmith.eval.drafters import BASELINE

FORMULA = ("speedup(K) = (e + (1-e) * (1 - alpha^(K+1)) / (1 - alpha)) / (e + (1-e) * (K*c + verify_ratio(K))), "
           "e = share of cycles that drafted nothing, alpha fitted to the others; at the run's K, "
           "predicted_speedup = mu / mean over cycles of (d*c + verify_ratio(d)), d = tokens drafted")


def _cycles(records: Sequence[dict]) -> tuple[list[int], list[int]] | None:
    drafted = stats.drafted_lengths(records)
    return None if drafted is None else (stats.accepted_lengths(records), drafted)


def decode_phase(baseline: Sequence[dict], drafted: Sequence[dict], cycle_cost: float) -> dict[str, float]:
    """The decode phase (after the prefill's token) predicted against measured: the model's speedup is tokens per
    cycle over the cycle's cost in target steps, and `engine_efficiency` is the share of it the decoder realized.
    For the oracle (every draft accepted, nothing to compute) the shortfall is the decoder's own overhead: its
    work between forwards, and forwards on real contexts costing other than the timed ones."""
    predicted = stats.decode_tokens_per_cycle(drafted) / cycle_cost if cycle_cost > 0 else float("nan")
    measured = stats.decode_speedup(baseline, drafted)
    return {"predicted_decode_speedup": predicted, "measured_decode_speedup": measured,
            "engine_efficiency": measured / predicted if predicted > 0 else float("nan")}


def fit_cost_model(records: Mapping[str, Sequence[dict]], names: Sequence[str], groups: Mapping[str, Sequence[int]],
                   forward_seconds: Mapping[int, float], *, k: int, ks: Sequence[int]) -> dict[str, Any]:
    """records: method -> records aligned by prompt (BASELINE included); groups: domain -> prompt indices;
    forward_seconds: n new tokens -> seconds of a target forward over them on a cached context."""
    step = forward_seconds[1]
    ratios = cm.verify_ratios(forward_seconds)
    base = records[BASELINE]
    base_per_token = sum(r["seconds"] for r in base) / max(1, sum(stats.new_tokens(r) for r in base))
    everything = {"overall": list(range(len(base)))}
    drafters = {}
    for name in names:
        recs = records[name]
        draft_seconds = sum(float(r.get("draft_seconds") or 0.0) for r in recs)
        cycles = len(stats.accepted_lengths(recs))
        drafted = stats.drafted_lengths(recs)
        # c per drafted token: drafters with a per-step length draft fewer than K in most cycles
        c = cm.draft_step_cost(draft_seconds, 1, sum(drafted), step) if drafted and sum(drafted) else \
            cm.draft_step_cost(draft_seconds, cycles, k, step)

        def fit(parts: Mapping[str, Sequence[int]]) -> dict[str, Any]:
            pick = {d: [recs[i] for i in idx] for d, idx in parts.items()}
            plain = {d: [base[i] for i in idx] for d, idx in parts.items()}
            fitted = cm.drafter_cost_model(
                k=k, c=c, ratios=ratios, ks=ks, mu_by_domain={d: stats.mu(rs) for d, rs in pick.items()},
                measured_by_domain={d: stats.speedup(plain[d], rs) for d, rs in pick.items()},
                cycles_by_domain={d: _cycles(rs) for d, rs in pick.items()})
            for d, rs in pick.items():
                fitted["domains"][d].update(decode_phase(plain[d], rs, fitted["domains"][d]["cycle_cost"]))
            return fitted

        block = fit(groups)
        block["overall"] = fit(everything)["domains"]["overall"]
        per_cycle = max(1, cycles) * step
        seconds = sum(r["seconds"] for r in recs)
        verify = sum(float(r.get("verify_seconds") or 0.0) for r in recs)
        # what one cycle really cost in the run, in target steps: the gap between model and measurement
        block["run_verify_ratio"] = verify / per_cycle
        block["run_overhead_per_cycle"] = (seconds - draft_seconds - verify) / per_cycle
        drafters[name] = block
    return {"formula": FORMULA, "target_step_seconds": step, "forward_seconds": dict(forward_seconds),
            "verify_ratio": ratios, "baseline_seconds_per_token": base_per_token,
            "baseline_step_ratio": base_per_token / step, "drafters": drafters}


def refit(result: dict) -> dict[str, Any]:
    """The cost-model block re-fitted from a saved OUT.json (its records and forward timings)."""
    names = [d["name"] for d in result["drafters"]]
    records: dict[str, list[dict]] = {}
    for rec in result["records"]:
        records.setdefault(rec["drafter"], []).append(rec)
    groups: dict[str, list[int]] = {}
    for i, rec in enumerate(records[BASELINE]):
        groups.setdefault(rec["domain"], []).append(i)
    old = result["cost_model"]
    seconds = {int(n): float(s) for n, s in old["forward_seconds"].items()}
    ks = sorted(int(kk) for kk in next(iter(old["drafters"].values()))["overall"]["predicted_speedup_by_k"])
    fitted = fit_cost_model(records, names, groups, seconds, k=result["settings"]["k"], ks=ks)
    return {**old, **fitted}
