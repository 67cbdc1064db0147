"""A `batch_size` sweep point, and where speculation stops paying: the measured crossover batch against the one the
cost model predicts.

At each batch size B the drafters are compared with the faster plain decoder at B (ours or transformers' batched
`generate`). The prediction takes each drafter's batch-1 run (μ, the drafts of each cycle, drafting seconds per
cycle) and the target's verify costs measured at B (serve/core/costs.py). A cycle of B rows drafting as at batch 1
verifies as wide as its widest row, d_max = the largest of B draws from the batch-1 draft lengths, costs
V(d_max, B) / V(0, B) plain steps plus B rows' drafting, and yields μ tokens per row:
    predicted speedup(B) = μ / (E[V(d_max, B) / V(0, B)] + B * draft seconds per cycle / step seconds at B).
The crossover is the smallest swept B whose speedup falls below 1.
"""
from __future__ import annotations

from collections import Counter
from typing import Any, Callable, Mapping, Sequence

from draftsmith.eval import runner
from draftsmith.eval.batch_runner import HF_BATCHED, run_batched
from draftsmith.eval.config import EvalConfig
from draftsmith.eval.drafters import BASELINE
from draftsmith.eval.stats import tokens_per_second
from draftsmith.serve.core.target import Target


def batch_point(target: Target, entries: Sequence[Any], prompts: Sequence[Any], decoding: runner.Decoding,
                config: EvalConfig, batch_size: int) -> tuple[dict, dict, Sequence[str], dict, dict]:
    """Run one batch size -> (domains, overall, names, exactness, plain) with the drafters summarized against
    the faster plain decoder; `plain` says both baselines' tokens/s and which one was used."""
    records = run_batched(target, entries, prompts, decoding, batch_size=batch_size, repeats=config.repeats,
                          progress=config.progress, desc=f"sweep batch_size={batch_size}")
    names = [e.name for e in entries]
    runner.mark_exactness(records, names + [HF_BATCHED])
    ours, hf = tokens_per_second(records[BASELINE]), tokens_per_second(records[HF_BATCHED])
    baseline = BASELINE if ours >= hf else HF_BATCHED
    against = {**records, BASELINE: records[baseline]}
    domains, overall = runner.summarize_methods(against, names, prompts, k=decoding.k, config=config)
    exactness = runner.exactness_block(records, names, decoding.temperature, target=target,
                                          top_k=decoding.top_k, top_p=decoding.top_p)
    hf_same = sum(r["matches_plain"] for r in records[HF_BATCHED])
    plain = {"ours_tokens_per_second": ours, "hf_generate_tokens_per_second": hf,
             "baseline": "ours" if baseline == BASELINE else "hf_generate",
             "hf_generate_identical": f"{hf_same}/{len(records[HF_BATCHED])}"}
    return domains, overall, names, exactness, plain


def expected_widest(ratio: Callable[[int], float], drafted: Sequence[int], rows: int) -> float:
    """E[ratio(the largest of `rows` independent draws from `drafted`)]: P(max <= w) = F(w) ** rows."""
    if not drafted:
        return ratio(0)
    counts = Counter(drafted)
    total, below, expected = len(drafted), 0, 0.0
    for w in sorted(counts):
        before = (below / total) ** rows
        below += counts[w]
        expected += ratio(w) * ((below / total) ** rows - before)
    return expected


def predicted_speedup(overall_1: Mapping[str, Any], drafted: Sequence[int], costs_at: Callable[[int], Any],
                      batch_size: int) -> float:
    """The cost model's speedup at `batch_size` for a drafter whose batch-1 summary is `overall_1` and whose batch-1
    cycles drafted `drafted` tokens each."""
    costs = costs_at(batch_size)
    cycles = max(1, int(overall_1.get("cycles") or 0))
    draft_steps = batch_size * float(overall_1.get("draft_seconds") or 0.0) / cycles / costs.step_seconds
    return float(overall_1["mu"]) / (expected_widest(costs.ratio, drafted, batch_size) + draft_steps)


def crossover(points: Sequence[Mapping[str, Any]], speedup_of: Callable[[Mapping[str, Any]], float]) -> int | None:
    """The smallest batch size whose speedup is below 1 (None: speculation paid at every swept size)."""
    for point in sorted(points, key=lambda p: p["value"]):
        if speedup_of(point) < 1.0:
            return int(point["value"])
    return None


def crossovers(points: Sequence[Mapping[str, Any]], names: Sequence[str], base_overall: Mapping[str, Any],
               base_records: Sequence[Mapping[str, Any]], costs_at: Callable[[int], Any]) -> dict[str, dict[str, Any]]:
    """Per drafter: predicted speedup per batch size, and the predicted and measured crossover batch."""
    out = {}
    for name in names:
        drafted = [int(d) for r in base_records if r.get("drafter") == name for d in r.get("drafted_per_cycle") or []]
        predicted = {int(p["value"]): predicted_speedup(base_overall[name], drafted, costs_at, int(p["value"]))
                     for p in points}
        out[name] = {"predicted_speedup": predicted,
                     "predicted_crossover": crossover(points, lambda p: predicted[int(p["value"])]),
                     "measured_crossover": crossover(points, lambda p: p["overall"][name]["speedup"])}
    return out
