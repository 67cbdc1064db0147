"""The side-by-side run behind `evaluate` (eval/evaluate.py): μ per domain and wall-clock speed, interleaved.

Per prompt, every method runs back to back (plain, drafter 1, drafter 2, ..., peers), so the noise of
a shared machine hits them alike; speedups are ratios within that run. Every number of the result is
recomputed from the per-prompt records it carries (eval/stats.py).
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, Sequence

import torch

from draftsmith.eval import stats
from draftsmith.eval.audit import audit
from draftsmith.eval.config import EvalConfig
from draftsmith.eval.cost_fit import fit_cost_model
from draftsmith.eval.costs import context_ids, fastest, forward_times, invariance_costs, median
from draftsmith.eval.drafters import BASELINE, BeginTimed, DrafterEntry
from draftsmith.eval.peers import Peer, run_peer
from draftsmith.eval.prompts import EvalPrompt, group_by_domain
from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.methods.registry import has
from draftsmith.serve.core.target import Target

WARMUP_TOKENS = 16  # the untimed runs before timing: one per method at the start, one plain run per prompt


@dataclass(frozen=True)
class Decoding:
    """The decoding settings every method of one run shares (what a sweep varies)."""
    k: int
    temperature: float
    top_k: int
    top_p: float
    max_new_tokens: int
    seed: int

    @classmethod
    def from_config(cls, config: EvalConfig) -> "Decoding":
        return cls(k=config.k, temperature=config.temperature, top_k=config.top_k, top_p=config.top_p,
                   max_new_tokens=config.max_new_tokens, seed=config.seed)

    def check(self) -> None:
        if self.k < 1:
            raise DraftsmithError(f"k must be >= 1, got {self.k}")
        if self.max_new_tokens < 1:
            raise DraftsmithError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise DraftsmithError(f"temperature must be >= 0, got {self.temperature}")


# ---------------------------------------------------------------------------------------------- running

def _plain(target: Target, input_ids: torch.Tensor, d: Decoding, seed: int) -> dict[str, Any]:
    from draftsmith.serve.decoding import plain_generate

    res = plain_generate(target, input_ids, max_new_tokens=d.max_new_tokens, temperature=d.temperature,
                         top_k=d.top_k, top_p=d.top_p, seed=seed)
    return _from_result(res)


def _speculative(target: Target, entry: DrafterEntry, input_ids: torch.Tensor, d: Decoding, seed: int) -> dict[str, Any]:
    from draftsmith.serve.decoding import speculative_generate

    drafter = BeginTimed(entry.drafter) if has(entry.kind, "ceiling") else entry.drafter
    reasons = Counter(getattr(drafter, "reasons", {}))  # a hybrid's (part, why) per cycle, before this prompt
    res = speculative_generate(target, drafter, input_ids, max_new_tokens=d.max_new_tokens, k=d.k,
                               temperature=d.temperature, top_k=d.top_k, top_p=d.top_p, seed=seed,
                               tree=entry.tree)
    out = _from_result(res)
    if hasattr(drafter, "reasons"):
        out["drafted_by"] = {f"{part}: {why}": n for (part, why), n in (Counter(drafter.reasons) - reasons).items()}
    ledger = getattr(drafter, "ledger", None)  # a hybrid's arms scored on this prompt (serve/methods/hybrid/arms.py)
    if ledger is not None:
        out["arms"] = {"cycles": ledger.cycles, "tokens": dict(ledger.tokens), "cost": dict(ledger.cost)}
    if isinstance(drafter, BeginTimed):
        # the oracle precomputes the target's own answer in begin(); that is not a cost a real drafter has
        out["excluded_seconds"] = drafter.begin_seconds
    return out


def _from_result(res: Any) -> dict[str, Any]:
    s = res.stats
    return {"output_token_ids": [int(t) for t in res.output_ids], "target_forwards": int(s.target_forwards),
            "accepted_per_cycle": [int(a) for a in s.accepted_per_cycle],
            "drafted_per_cycle": [int(a) for a in s.drafted_per_cycle], "cycles": int(s.cycles),
            "draft_seconds": float(s.draft_seconds), "verify_seconds": float(s.verify_seconds),
            "decode_seconds": float(s.decode_seconds)}


def _timed(fn: Callable[[], dict[str, Any]], device: torch.device) -> dict[str, Any]:
    """Wall-clock time of one whole generation, measured the same way for every method."""
    start = time.perf_counter()
    out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    out["seconds"] = time.perf_counter() - start - out.get("excluded_seconds", 0.0)
    return out


def fastest_run(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One record from repeated runs of one method on one prompt: the fastest, with every run's seconds
    (`repeat_seconds`, in the order run) and whether any run's output differed from it (`repeats_differ`: a
    deterministic decoder repeats itself; at temperature 0 a difference is an exactness failure)."""
    best = min(runs, key=lambda r: r["seconds"])
    return {**best, "repeat_seconds": [r["seconds"] for r in runs],
            "repeats_differ": any(r["output_token_ids"] != best["output_token_ids"] for r in runs)}


def run_methods(target: Target, entries: Sequence[DrafterEntry], peers: Sequence[Peer], prompts: Sequence[EvalPrompt],
                decoding: Decoding, *, warmup: bool = True, progress: bool = True, repeats: int = 1,
                desc: str = "eval") -> dict[str, list[dict[str, Any]]]:
    """Run plain decoding, every drafter and every peer on every prompt, interleaved prompt by prompt; with
    `repeats` > 1 every method runs that many times per prompt (all methods once, then again) and its fastest
    run is kept (`fastest_run`).

    Returns method name -> records aligned with `prompts`.
    """
    decoding.check()
    if repeats < 1:
        raise DraftsmithError(f"repeats must be >= 1, got {repeats}")
    device = next(target.model.parameters()).device

    def methods(p: EvalPrompt, seed: int, d: Decoding) -> list[tuple[str, Callable[[], dict[str, Any]]]]:
        ids = torch.tensor([p.input_ids], dtype=torch.long, device=device)  # (1, T)
        out: list[tuple[str, Callable[[], dict[str, Any]]]] = [(BASELINE, lambda: _plain(target, ids, d, seed))]
        for e in entries:
            out.append((e.name, lambda e=e: _speculative(target, e, ids, d, seed)))
        for peer in peers:
            out.append((peer.name, lambda peer=peer: run_peer(
                peer, target, p.input_ids, k=d.k, max_new_tokens=d.max_new_tokens, temperature=d.temperature,
                top_k=d.top_k, top_p=d.top_p, seed=seed)))
        return out

    short = replace(decoding, max_new_tokens=min(WARMUP_TOKENS, decoding.max_new_tokens))
    if warmup and prompts:  # first calls pay for lazy initialisation; keep them out of the timings
        oracles = {e.name for e in entries if has(e.kind, "ceiling")}  # their begin() is a whole plain run
        for name, fn in methods(prompts[0], decoding.seed, short):
            if name not in oracles:
                fn()

    names = [BASELINE] + [e.name for e in entries] + [p.name for p in peers]
    records: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    bar = _progress(total=len(prompts) * len(names) * repeats, desc=desc, enabled=progress)
    try:
        for i, p in enumerate(prompts):
            if warmup:
                # A prompt's first run pays for shapes this process has not run yet (its prefill length): up to
                # 10% of a 128-token generation on CPU. Untimed, so the method timed first is not charged for it.
                methods(p, decoding.seed + i, short)[0][1]()
            runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
            timed = methods(p, decoding.seed + i, decoding)
            for _ in range(repeats):
                for name, fn in timed:
                    runs[name].append({"accepted_per_cycle": None, **_timed(fn, device)})
                    bar.update(1)
            for name in names:
                rec = fastest_run(runs[name]) if repeats > 1 else runs[name][0]
                records[name].append({"id": p.id, "domain": p.domain, "drafter": name,
                                      "prompt_token_ids": list(p.input_ids), "seed": decoding.seed + i, **rec})
            bar.set_postfix(_running_speedups(records, entries), refresh=False)
    finally:
        bar.close()
    return records


def _progress(*, total: int, desc: str, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="run", disable=not enabled, dynamic_ncols=True)


def _running_speedups(records: Mapping[str, list[dict]], entries: Sequence[DrafterEntry]) -> dict[str, str]:
    base = records[BASELINE]
    return {e.name: f"{stats.speedup(base, records[e.name][:len(base)]):.2f}x"
            for e in entries if len(records[e.name]) == len(base)}


# ------------------------------------------------------------------------------------------- summarizing

def mark_exactness(records: Mapping[str, list[dict]], names: Sequence[str]) -> None:
    """Annotate every record of `names` with whether its output equals plain decoding's, token by token."""
    base = records[BASELINE]
    for name in names:
        for ref, rec in zip(base, records[name]):
            pos = stats.first_mismatch(ref["output_token_ids"], rec["output_token_ids"])
            rec["matches_plain"] = stats.same_output(ref, rec)
            rec["first_mismatch"] = pos


def drafted_by_block(records: Mapping[str, list[dict]], names: Sequence[str]) -> dict[str, Any]:
    """A hybrid's cycles by the part that drafted them and why, over every prompt and per domain, and (`arms`) what
    each way of drafting would have yielded on the cycles it scored; drafters that do not choose (no `drafted_by` in
    their records) are left out."""
    out: dict[str, Any] = {}
    for name in names:
        recs = [rec for rec in records[name] if "drafted_by" in rec]
        if not recs:
            continue
        overall: Counter = Counter()
        domains: dict[str, Counter] = {}
        for rec in recs:
            overall.update(rec["drafted_by"])
            domains.setdefault(rec["domain"], Counter()).update(rec["drafted_by"])
        out[name] = {"overall": dict(overall.most_common()),
                     "domains": {d: dict(c.most_common()) for d, c in domains.items()}}
        scored = [rec for rec in recs if "arms" in rec]
        if scored:
            out[name]["arms"] = {"overall": sum_arms(scored),
                                 "domains": {d: sum_arms([r for r in scored if r["domain"] == d]) for d in domains}}
    return out


def sum_arms(records: Sequence[dict]) -> dict[str, Any]:
    """A hybrid's arm scores summed over records: scored cycles, and per arm the tokens it would have produced and
    the target steps it would have cost on them."""
    total = {"cycles": 0, "tokens": Counter(), "cost": Counter()}
    for rec in records:
        total["cycles"] += rec["arms"]["cycles"]
        total["tokens"].update(rec["arms"]["tokens"])
        total["cost"].update(rec["arms"]["cost"])
    return {"cycles": total["cycles"], "tokens": dict(total["tokens"]), "cost": dict(total["cost"])}


def exactness_block(records: Mapping[str, list[dict]], names: Sequence[str], temperature: float, *,
                    target: Target | None = None, top_k: int = 0, top_p: float = 1.0) -> dict[str, Any]:
    """{identical, total} over every (prompt, name) pair. Every run is seeded (the record's `seed`), and a seeded
    run draws each output position's randomness from its seed and position (serve/core/noise.py): at any
    temperature a drafter's output must be plain decoding's with the same seed, token for token. With `target`,
    every divergence is audited too (eval/audit.py: a rounding flip of the target's precision, or unexplained)."""
    by = {name: stats.exactness(records[BASELINE], records[name]) for name in names}
    block = {"identical": sum(b["identical"] for b in by.values()), "total": sum(b["total"] for b in by.values()),
             "checked": True, "by_drafter": by, "temperature": temperature,
             "against": "plain greedy decoding" if temperature <= 0 else "plain seeded decoding"}
    if target is not None:
        sampling = dict(temperature=temperature, top_k=top_k, top_p=top_p) if temperature > 0 else None
        block["audit"] = audit(target, records, names, baseline=BASELINE, sampling=sampling)
    return block


def summarize_methods(records: Mapping[str, list[dict]], names: Sequence[str], prompts: Sequence[EvalPrompt], *,
                      k: int, config: EvalConfig) -> tuple[dict[str, dict], dict[str, dict]]:
    """(domains -> name -> summary, name -> overall summary) of `names` against the plain baseline."""
    opts = dict(k=k, samples=config.bootstrap_samples, level=config.ci_level, seed=config.seed)
    base = records[BASELINE]
    domains: dict[str, dict] = {}
    for domain, idx in group_by_domain(prompts).items():
        domains[domain] = {name: stats.summarize([base[i] for i in idx], [records[name][i] for i in idx], **opts)
                           for name in names}
    overall = {name: stats.summarize(base, records[name], **opts) for name in names}
    return domains, overall


def baseline_block(records: Mapping[str, list[dict]], prompts: Sequence[EvalPrompt]) -> dict[str, Any]:
    base = records[BASELINE]
    return {"tokens_per_second": stats.tokens_per_second(base),
            "seconds": sum(r["seconds"] for r in base),
            "new_tokens": sum(stats.new_tokens(r) for r in base),
            "domains": {d: {"prompts": len(idx), "tokens_per_second": stats.tokens_per_second([base[i] for i in idx])}
                        for d, idx in group_by_domain(prompts).items()}}


_PEER_KEYS = ("prompts", "mu", "tokens_per_second", "baseline_tokens_per_second", "speedup", "speedup_spread",
              "new_tokens", "target_forwards", "seconds")


def peers_block(records: Mapping[str, list[dict]], peers: Sequence[Peer], prompts: Sequence[EvalPrompt], *,
                k: int, config: EvalConfig) -> dict[str, Any]:
    """Each peer against our plain baseline (and against transformers' plain generate when run)."""
    if not peers:
        return {}
    domains, overall = summarize_methods(records, [p.name for p in peers], prompts, k=k, config=config)
    out: dict[str, Any] = {}
    for peer in peers:
        block: dict[str, Any] = {**peer.describe(), "k": k if peer.kind != "hf_generate" else None}
        block.update({key: overall[peer.name][key] for key in _PEER_KEYS})
        if "hf_plain" in records and peer.name != "hf_plain":
            block["speedup_vs_hf_plain"] = stats.speedup(records["hf_plain"], records[peer.name])
        block["exactness"] = (stats.exactness(records[BASELINE], records[peer.name])
                              if config.temperature == 0 else None)
        block["domains"] = {d: {key: domains[d][peer.name][key] for key in _PEER_KEYS} for d in domains}
        out[peer.name] = block
    return out


def cost_model_block(target: Target, records: Mapping[str, list[dict]], names: Sequence[str],
                     prompts: Sequence[EvalPrompt], *, k: int, config: EvalConfig) -> dict[str, Any]:
    """Measure the target's step and verify costs now, then fit the cost model to this run's records."""
    ks = sorted(set(config.cost_ks) | {k})
    ctx = context_ids([p.input_ids for p in prompts], config.cost_context_tokens)
    times = forward_times(target.model, ctx, [1] + [kk + 1 for kk in ks], repeats=config.cost_repeats)
    fitted = fit_cost_model(records, names, group_by_domain(prompts), fastest(times), k=k, ks=ks)
    # forward_seconds holds the fastest repeat of each size (what the fit uses); the medians are for the record
    return {**fitted, "context_tokens": int(ctx.shape[1]), "forward_seconds_median": median(times),
            "invariance": invariance_costs(target.model, ctx, [1, k + 1], repeats=config.cost_repeats)}


# ------------------------------------------------------------------------------------------- entry point
