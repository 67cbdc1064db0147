"""The statistics of an evaluation, as pure functions of per-prompt records.

A record is one generation of one prompt by one drafter (or by plain decoding): a dict with at least
`output_token_ids`, `target_forwards`, `seconds` and, for speculative runs, `accepted_per_cycle`.
Every number in the report is computed here from records, so anyone can recompute it from OUT.json.
"""
from __future__ import annotations

import math
import random
import statistics
from typing import Iterable, Mapping, Sequence

Record = Mapping[str, object]


def new_tokens(record: Record) -> int:
    return len(record["output_token_ids"])  # type: ignore[arg-type]


def mu(records: Iterable[Record]) -> float:
    """Tokens per target forward over all records (bonus token included; plain decoding gives 1.0).

    A ratio of sums, so long generations weigh by their length, as they do in serving.
    """
    records = list(records)
    forwards = sum(int(r["target_forwards"]) for r in records)  # type: ignore[arg-type]
    if forwards == 0:
        return float("nan")
    return sum(new_tokens(r) for r in records) / forwards


def accepted_lengths(records: Iterable[Record]) -> list[int]:
    """Accepted draft tokens of every cycle of every record, in order."""
    return [int(a) for r in records for a in (r.get("accepted_per_cycle") or ())]  # type: ignore[union-attr]


def drafted_lengths(records: Iterable[Record]) -> list[int] | None:
    """Draft tokens proposed in every cycle (aligned with `accepted_lengths`); None if a record lacks them."""
    out: list[int] = []
    for r in records:
        accepted, drafted = r.get("accepted_per_cycle") or (), r.get("drafted_per_cycle")
        if drafted is None:
            if accepted:
                return None
            continue
        out.extend(int(d) for d in drafted)  # type: ignore[union-attr]
    return out


def acceptance_by_position(accepted: Sequence[int], k: int, drafted: Sequence[int] | None = None) -> list[float]:
    """P(draft token i accepted | tokens 1..i-1 accepted) for i = 1..k, from per-cycle accepted lengths.

    A cycle that accepted m tokens reached positions 1..m+1. With `drafted` (tokens proposed per cycle),
    only cycles that proposed at least i tokens count at position i, as in draftsmith.serve.decoding.SpecStats: a
    drafter that proposes nothing (n-gram without a match) is neither accepted nor rejected there.
    Without it, a missing proposal counts as a rejection. Positions no cycle reached are NaN.
    """
    if drafted is not None and len(drafted) != len(accepted):
        raise ValueError(f"{len(accepted)} accepted lengths but {len(drafted)} drafted lengths")
    rates = []
    for i in range(1, k + 1):
        reached = [m for j, m in enumerate(accepted) if m >= i - 1 and (drafted is None or drafted[j] >= i)]
        rates.append(sum(1 for m in reached if m >= i) / len(reached) if reached else float("nan"))
    return rates


def accept_length_histogram(accepted: Sequence[int], k: int) -> list[int]:
    """counts[m] = number of cycles that accepted exactly m draft tokens, m = 0..max(k, longest seen)."""
    size = max([k] + list(accepted)) + 1
    counts = [0] * size
    for m in accepted:
        counts[m] += 1
    return counts


def tokens_per_second(records: Iterable[Record]) -> float:
    records = list(records)
    seconds = sum(float(r["seconds"]) for r in records)  # type: ignore[arg-type]
    return sum(new_tokens(r) for r in records) / seconds if seconds > 0 else float("nan")


def speedup(baseline: Sequence[Record], drafted: Sequence[Record]) -> float:
    """Throughput of the drafted runs over that of the baseline runs of the same prompts.

    At temperature 0 both produce the same tokens, so this is baseline seconds / drafted seconds;
    with sampling the lengths differ and the per-token time is the fair comparison.
    """
    return tokens_per_second(drafted) / tokens_per_second(baseline)


def decode_tokens(records: Iterable[Record]) -> int:
    """New tokens after the first of every record: what the decode phase produced (the prefill yields the first)."""
    return sum(max(0, new_tokens(r) - 1) for r in records)


def decode_tokens_per_second(records: Iterable[Record]) -> float:
    """Tokens after the first per second after the first token (the decode phase; NaN when a record lacks
    `decode_seconds`, as results saved before it was recorded do)."""
    records = list(records)
    seconds = [r.get("decode_seconds") for r in records]
    if not records or any(s is None for s in seconds):
        return float("nan")
    total = sum(float(s) for s in seconds)  # type: ignore[arg-type]
    return decode_tokens(records) / total if total > 0 else float("nan")


def decode_speedup(baseline: Sequence[Record], drafted: Sequence[Record]) -> float:
    """`speedup` of the decode phase alone. The prefill (the prompt's forward, which yields the first token) costs
    every method the same and no drafter can shorten it; leaving it out gives the speedup the cost model predicts
    (and, for the oracle, the decoder's efficiency)."""
    return decode_tokens_per_second(drafted) / decode_tokens_per_second(baseline)


def decode_tokens_per_cycle(records: Iterable[Record]) -> float:
    """Tokens per verification cycle after the prefill's token (μ of the decode phase alone)."""
    records = list(records)
    cycles = sum(len(r.get("accepted_per_cycle") or ()) for r in records)  # type: ignore[arg-type]
    return decode_tokens(records) / cycles if cycles else float("nan")


def paired_speedups(baseline: Sequence[Record], drafted: Sequence[Record]) -> list[float]:
    """One speedup per prompt; `baseline[i]` and `drafted[i]` are runs of the same prompt."""
    if len(baseline) != len(drafted):
        raise ValueError(f"paired records differ in number: {len(baseline)} baseline vs {len(drafted)} drafted")
    return [speedup([b], [d]) for b, d in zip(baseline, drafted)]


def bootstrap_ci(baseline: Sequence[Record], drafted: Sequence[Record], *, samples: int = 1000,
                 level: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap CI of `speedup`, resampling prompts (pairs kept together)."""
    n = len(baseline)
    if n == 0 or samples <= 0:
        return (float("nan"), float("nan"))
    rng = random.Random(seed)
    values = []
    for _ in range(samples):
        idx = [rng.randrange(n) for _ in range(n)]
        values.append(speedup([baseline[i] for i in idx], [drafted[i] for i in idx]))
    values.sort()
    lo = values[int(math.floor((1 - level) / 2 * (samples - 1)))]
    hi = values[int(math.ceil((1 + level) / 2 * (samples - 1)))]
    return (lo, hi)


def spread(values: Sequence[float]) -> dict[str, float]:
    """min / median / max of per-prompt values."""
    if not values:
        return {"min": float("nan"), "median": float("nan"), "max": float("nan")}
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def speedup_spread(baseline: Sequence[Record], drafted: Sequence[Record], *, samples: int = 1000,
                   level: float = 0.95, seed: int = 0) -> dict[str, object]:
    """Per-prompt min/median/max and a bootstrap CI of the aggregate speedup."""
    out: dict[str, object] = dict(spread(paired_speedups(baseline, drafted)))
    lo, hi = bootstrap_ci(baseline, drafted, samples=samples, level=level, seed=seed)
    out.update(ci_low=lo, ci_high=hi, ci_level=level, n=len(baseline))
    return out


def timing_spread(records: Iterable[Record]) -> float:
    """How far repeated runs of one method on one prompt differ in time: the median over records with
    `repeat_seconds` of (slowest / fastest - 1). The resolution of the run's speedups; NaN without repeats."""
    spreads = [max(t) / min(t) - 1.0 for r in records
               if len(t := list(r.get("repeat_seconds") or ())) > 1 and min(t) > 0]  # type: ignore[call-overload]
    return statistics.median(spreads) if spreads else float("nan")


def same_output(reference: Record, candidate: Record) -> bool:
    """Token-identical outputs, from runs that repeated themselves (`repeats_differ` unset on both)."""
    return (list(reference["output_token_ids"]) == list(candidate["output_token_ids"])  # type: ignore[call-overload]
            and not reference.get("repeats_differ") and not candidate.get("repeats_differ"))


def exactness(reference: Sequence[Record], candidate: Sequence[Record]) -> dict[str, int]:
    """How many candidate outputs are token-identical to the reference output of the same prompt (a prompt
    whose repeated runs gave different outputs counts as not identical)."""
    if len(reference) != len(candidate):
        raise ValueError(f"paired records differ in number: {len(reference)} vs {len(candidate)}")
    identical = sum(1 for r, c in zip(reference, candidate) if same_output(r, c))
    return {"identical": identical, "total": len(reference)}


def exactness_verdict(exactness_block: dict) -> str:
    """One line (plain text) on what a temperature-0 comparison with plain decoding shows, with the audit's
    classification of the divergences (eval/audit.py) when the block carries it."""
    if exactness_block["identical"] == exactness_block["total"]:
        return "all identical"
    audit = exactness_block.get("audit")
    if audit is None:
        return "MISMATCH: decoding is not lossless"
    flips, unexplained = audit["rounding_flips"], audit["unexplained"]
    if unexplained:
        return (f"MISMATCH: {unexplained} divergence{'s' * (unexplained != 1)} unexplained by rounding (a bug), "
                f"{flips} rounding flip{'s' * (flips != 1)}")
    return (f"{flips} rounding flip{'s' * (flips != 1)}: each time, two tokens whose {audit['reference_dtype']} "
            f"logits lie within {audit['dtype']}'s rounding of each other swapped places (no bug); "
            f"target.invariant=on makes the target's forwards batch-invariant")


def first_mismatch(reference: Sequence[int], candidate: Sequence[int]) -> int | None:
    """Index of the first differing token (or the shorter length when one is a prefix); None if equal."""
    for i, (a, b) in enumerate(zip(reference, candidate)):
        if a != b:
            return i
    return None if len(reference) == len(candidate) else min(len(reference), len(candidate))


def summarize(baseline: Sequence[Record], drafted: Sequence[Record], *, k: int, samples: int = 1000,
              level: float = 0.95, seed: int = 0) -> dict[str, object]:
    """The per-(drafter, domain) block of OUT.json from paired baseline and drafted records."""
    accepted = accepted_lengths(drafted)
    proposed = drafted_lengths(drafted)
    return {
        "prompts": len(drafted),
        "mu": mu(drafted),
        "acceptance_by_position": acceptance_by_position(accepted, k, proposed),
        "accept_length_histogram": accept_length_histogram(accepted, k),
        "tokens_per_second": tokens_per_second(drafted),
        "baseline_tokens_per_second": tokens_per_second(baseline),
        "speedup": speedup(baseline, drafted),
        "speedup_spread": speedup_spread(baseline, drafted, samples=samples, level=level, seed=seed),
        "decode_speedup": decode_speedup(baseline, drafted),
        "new_tokens": sum(new_tokens(r) for r in drafted),
        "target_forwards": sum(int(r["target_forwards"]) for r in drafted),  # type: ignore[arg-type]
        "cycles": len(accepted),
        "empty_draft_cycles": sum(1 for d in proposed if d == 0) if proposed is not None else None,
        "drafted_per_cycle": statistics.mean(proposed) if proposed else float("nan"),
        "seconds": sum(float(r["seconds"]) for r in drafted),  # type: ignore[arg-type]
        "draft_seconds": sum(float(r.get("draft_seconds") or 0.0) for r in drafted),  # type: ignore[arg-type]
        "verify_seconds": sum(float(r.get("verify_seconds") or 0.0) for r in drafted),  # type: ignore[arg-type]
        "baseline_seconds": sum(float(r["seconds"]) for r in baseline),  # type: ignore[arg-type]
    }
