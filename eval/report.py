"""The evaluation report: OUT.json (strict JSON, NaN written as null), DIR/report.md with the tables, and
the PNG plots beside it."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from draftsmith.eval.plots import write_plots
from draftsmith.eval.stats import exactness_verdict
from draftsmith.serve.core.files import write_text_atomic
from draftsmith.serve.methods.registry import has

ANCHORS = ("Published anchors (other targets, GPUs): EAGLE-3 μ ≈ 6.2 and 4.4× on LLaMA-3.1-8B (T=0, dynamic "
           "tree); EAGLE-2 μ ≈ 4.6–4.7; EAGLE-1 μ ≈ 3.6–4.0 on MT-bench; Medusa-1/2 ≈ 2.2× / 2.8×. Speedups on a "
           "small target on CPU are bounded by how little a target step costs relative to drafting and "
           "decoder overhead; compare μ first.")


def to_jsonable(value: Any) -> Any:
    """NaN / inf -> None, tuples -> lists, dict keys -> str: what strict JSON accepts."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    return value


def write_json(result: dict, path: str | Path) -> Path:
    return write_text_atomic(path, json.dumps(to_jsonable(result), indent=1, allow_nan=False) + "\n")


def _f(x: Any, digits: int = 2) -> str:
    if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x):
        return f"{x:.{digits}f}"
    return "–"


def _spread(s: dict | None) -> str:
    if not s:
        return "–"
    return (f"{_f(s.get('min'))} / {_f(s.get('median'))} / {_f(s.get('max'))} "
            f"(CI {_f(s.get('ci_low'))}–{_f(s.get('ci_high'))})")


def timing_line(settings: dict) -> str | None:
    """The console's line on timing (eval and demo): how runs were timed and how much repeats differed; None for
    one run per method and prompt, which has no resolution to state."""
    if settings.get("repeats", 1) > 1 and isinstance(settings.get("timing_spread"), float):
        return f"timing: {settings['timing']}; repeats differed by a median {100 * settings['timing_spread']:.1f}%"
    return None


def _timing(s: dict) -> str:
    repeats = int(s.get("repeats") or 1)
    if repeats == 1:
        return ("Timing: one run per method and prompt (`--repeats N` keeps the fastest of N, for speedups that "
                "differ by less than a noisy machine's run-to-run spread).")
    timing = f"Timing: {s.get('timing') or f'the fastest of {repeats} runs per method and prompt'}"
    if isinstance(s.get("timing_spread"), (int, float)):
        return (f"{timing}; repeated runs of one method on one prompt differed by a median "
                f"{100 * s['timing_spread']:.1f}% in time (the run's resolution).")
    return timing + "."


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"] + \
           ["| " + " | ".join(r) + " |" for r in rows]


def _acc(rates: list) -> str:
    return " ".join(_f(r) for r in rates)


def _peers_per_domain(result: dict) -> list[str]:
    """Speedup per domain of every peer beside our drafters of the same kind (prompt lookup beside n-gram)."""
    peers = [n for n, p in result["peers"].items() if p["kind"] != "hf_generate" and p.get("domains")]
    if not peers:
        return []
    lookup = any(result["peers"][n]["kind"] == "prompt_lookup" for n in peers)
    ours = [d["name"] for d in result["drafters"] if lookup and has(d["kind"], "lookup")]
    rows = [[domain] + [_f(result["domains"][domain][n]["speedup"]) + "×" for n in ours]
            + [_f(result["peers"][n]["domains"].get(domain, {}).get("speedup")) + "×" for n in peers]
            for domain in result["domains"]]
    return ["Speedup over our plain decoding per domain:", ""] + _table(["domain"] + ours + peers, rows) + [""]


def markdown(result: dict, plots: list[Path]) -> str:
    s, t = result["settings"], result["target"]
    names = [d["name"] for d in result["drafters"]]
    lines = [f"# draftsmith eval: {t['name']}", "",
             f"K={s['k']}, temperature={s['temperature']}, top_k={s['top_k']}, top_p={s['top_p']}, "
             f"max_new_tokens={s['max_new_tokens']}, seed={s['seed']}; {s['prompts_total']} prompts "
             f"({', '.join(f'{d}: {n}' for d, n in s['domains'].items())}); {s['dtype']} on {s['device']}, "
             f"{s['torch_threads']} threads ({s['machine']}); torch {s['torch']}, transformers {s['transformers']}.",
             "", f"Methods run interleaved per prompt in this order: {', '.join(s['order'])}. "
             f"Speedup: {s['speedup']}.", "", _timing(s), ""] + [f"Note: {n}." for n in s.get("notes") or []] + [""]
    lengths = s.get("draft_length") or {}
    lines += ["## Drafters", ""] + _table(["name", "kind", "draft length", "path"],
                                          [[d["name"], d["kind"], lengths.get(d["name"], "fixed"),
                                            str(d["path"] or "–")] for d in result["drafters"]]) + [""]
    ex = result["exactness"]
    lines += ["## Exactness", ""]
    if ex.get("checked"):
        verdict = exactness_verdict(ex)
        verdict = verdict if ex["identical"] == ex["total"] else f"**{verdict}**"
        invariant = " with batch-invariant target forwards" if s.get("invariant") else ""
        seeded = (" (every run seeded: each output position's randomness comes from the seed and the position, so "
                  "speculation must reproduce plain decoding's tokens)" if ex.get("temperature", 0) > 0 else "")
        lines.append(f"{ex['identical']}/{ex['total']} outputs token-identical to "
                     f"{ex.get('against', 'plain greedy decoding')} in {s.get('dtype')}{invariant} ({verdict}){seeded}.")
        audit = ex.get("audit") or {"by_drafter": {}}
        for name, b in (ex.get("by_drafter") or {}).items():
            kinds = audit["by_drafter"].get(name)
            why = (f" ({kinds['rounding flip']} rounding flips, {kinds['unexplained']} unexplained)"
                   if kinds and b["identical"] != b["total"] else "")
            lines.append(f"- {name}: {b['identical']}/{b['total']}{why}")
        for d in (audit.get("divergences") or [])[:20]:
            gap = "–" if d["gap"] is None else f"{d['gap']:.3g}"
            rounding = "–" if d["rounding"] is None else f"{d['rounding']:.3g}"
            lines.append(f"  - {d['drafter']} on {d['id']}: token {d['position']}, plain {d['plain_token']} against "
                         f"{d['drafter_token']}; {audit['reference_dtype']} gap {gap}, rounding {rounding}: {d['kind']}")
    else:
        lines.append(ex.get("note", "not checked"))
    lines.append("")

    head = ["domain", "drafter", "prompts", "μ", "acceptance by position", "tok/s", "plain tok/s", "speedup",
            "spread min/median/max (CI)", "draft s", "verify s"]
    rows = []
    for domain, per in list(result["domains"].items()) + [("**all**", result["overall"])]:
        for name in names:
            b = per[name]
            rows.append([domain, name, str(b["prompts"]), _f(b["mu"]), _acc(b["acceptance_by_position"]),
                         _f(b["tokens_per_second"], 1), _f(b["baseline_tokens_per_second"], 1),
                         _f(b["speedup"]) + "×", _spread(b["speedup_spread"]), _f(b.get("draft_seconds"), 1),
                         _f(b.get("verify_seconds"), 1)])
    lines += ["## μ and speed per domain", ""] + _table(head, rows) + [""]

    if result.get("winners"):
        lines += ["## Which drafter won, per domain", "",
                  "Best measured speedup of this run; `length` is how it chose its draft length (`auto`: per step, "
                  "from its calibrated confidence and the measured costs; `fixed`: K every cycle).", ""]
        rows = [[d, f"{w['drafter']}", w["length"], _f(w["speedup"]) + "×", _f(w["predicted_speedup"]) + "×",
                 _f(w["mu"]), f"{w['runner_up'] or '–'} ({_f(w['runner_up_speedup'])}×"
                 + (", a tie: closer than the run's resolution)" if w.get("tie") else ")")]
                for d, w in result["winners"].items()]
        lines += _table(["domain", "drafter", "length", "measured", "predicted", "μ", "runner-up"], rows) + [""]

    for name, by in (result.get("drafted_by") or {}).items():
        lines += [f"## Which part of {name} drafted, and why (cycles)", ""]
        reasons = list(by["overall"])
        lines += _table(["domain"] + reasons, [[d] + [str(c.get(r, 0)) for r in reasons]
                                              for d, c in by["domains"].items()]
                        + [["all"] + [str(by["overall"][r]) for r in reasons]]) + [""]
        if by.get("arms"):
            lines += [f"What each arm of {name} would have yielded on the cycles in which both parts proposed "
                      "(tokens and target steps per scored cycle; the tree's extra steps are what holding both chains "
                      "costs over one):", ""]
            arms = list(by["arms"]["overall"]["tokens"])
            rows = []
            for d, block in list(by["arms"]["domains"].items()) + [("all", by["arms"]["overall"])]:
                n = max(block["cycles"], 1)
                rows.append([d, str(block["cycles"])] + [
                    f"{block['tokens'][a] / n:.2f} / {block['cost'][a] / n:.2f}" for a in arms])
            lines += _table(["domain", "scored cycles"] + arms, rows) + [""]

    lines += ["## Accepted draft tokens per cycle (histogram, all prompts)", ""]
    width = max((len(result["overall"][n]["accept_length_histogram"]) for n in names), default=0)
    lines += _table(["drafter"] + [str(m) for m in range(width)],
                    [[n] + [str(c) for c in result["overall"][n]["accept_length_histogram"]]
                     + [""] * (width - len(result["overall"][n]["accept_length_histogram"])) for n in names]) + [""]

    if result.get("peers"):
        lines += ["## Peers (transformers' generate, same run)", ""]
        rows = []
        for name, p in result["peers"].items():
            ex_p = p.get("exactness")
            rows.append([name, p["kind"], str(p.get("k") or "–"), _f(p["mu"]), _f(p["tokens_per_second"], 1),
                         _f(p["speedup"]) + "×", _spread(p["speedup_spread"]),
                         _f(p.get("speedup_vs_hf_plain")) + ("×" if p.get("speedup_vs_hf_plain") else ""),
                         f"{ex_p['identical']}/{ex_p['total']}" if ex_p else "–"])
        lines += _table(["peer", "kind", "K", "μ", "tok/s", "speedup vs our plain", "spread", "vs hf_plain",
                         "identical to our plain"], rows) + [""]
        lines += _peers_per_domain(result)

    cost = result.get("cost_model")
    if cost:
        vr = cost["verify_ratio"]
        lines += ["## Cost model", "", f"`{cost['formula']}`", "",
                  f"Target step (1 token, {cost['context_tokens']}-token cached context): "
                  f"{1000 * cost['target_step_seconds']:.1f} ms; plain decoding costs "
                  f"{_f(cost['baseline_step_ratio'])} steps per token end to end.", "",
                  "Verify ratio (forward over K+1 tokens / over 1): "
                  + ", ".join(f"K={k}: {_f(v)}" for k, v in vr.items()), ""]
        rows = []
        for name, m in cost["drafters"].items():
            for domain, b in list(m["domains"].items()) + [("**all**", m["overall"])]:
                bk = b["best_k"]
                rows.append([name, domain, _f(m["c"], 3), _f(b["alpha"]), _f(b["mu"]), _f(b.get("cycle_cost")),
                             _f(b["predicted_speedup"]) + "×", _f(b["measured_speedup"]) + "×",
                             _f(b.get("predicted_decode_speedup")) + "×", _f(b.get("measured_decode_speedup")) + "×",
                             _f(b.get("engine_efficiency")),
                             f"K={bk['k']} ({_f(bk['predicted_speedup'])}×{'' if bk['pays'] else ', does not pay'})"])
        lines += _table(["drafter", "domain", "c", "α", "μ", "cycle cost (steps)", "predicted", "measured",
                         "decode: predicted", "decode: measured", "efficiency", "best K (predicted)"], rows)
        lines += ["", "`decode`: the phase after the prefill's first token, which no drafter can shorten; `efficiency` "
                  "= measured over predicted decode speedup, the share of the modelled gain the decoder realized."]
        lines += engine_lines(result)
        lines += invariance_lines(cost.get("invariance"), result["settings"])
        lines += ["", "Per cycle in the run, in target steps: "
                  + "; ".join(f"{n}: verify {_f(m['run_verify_ratio'])}, other overhead "
                              f"{_f(m['run_overhead_per_cycle'])}" for n, m in cost["drafters"].items()), ""]

    for axis, points in (result.get("sweeps") or {}).items():
        lines += [f"## Sweep: {axis}", ""]
        rows = [[str(p["value"]), n, _f(p["overall"][n]["mu"]), _f(p["overall"][n]["speedup"]) + "×",
                 _f(p["overall"][n]["tokens_per_second"], 1), _f(p["overall"][n]["baseline_tokens_per_second"], 1),
                 (f"{p['exactness']['identical']}/{p['exactness']['total']}" if p["exactness"].get("checked")
                  else "–")]
                for p in points for n in names]
        lines += _table([axis, "drafter", "μ", "speedup", "tok/s", "plain tok/s", "identical"], rows) + [""]
        if axis == "batch_size":
            lines += batch_lines(result, points)

    if plots:
        lines += ["## Plots", ""] + [f"![{p.stem}]({p.name})" for p in plots] + [""]
    lines += ["## Context", "", ANCHORS, ""]
    return "\n".join(lines)


def batch_lines(result: dict, points: list[dict]) -> list[str]:
    """Which plain decoder each batch size was measured against, and where speculation stops paying."""
    lines = ["Plain decoding at each batch size, ours against transformers' batched `generate` (the faster is the "
             "baseline above): " + "; ".join(
                 f"B={p['value']}: {_f(p['plain']['ours_tokens_per_second'], 1)} vs "
                 f"{_f(p['plain']['hf_generate_tokens_per_second'], 1)} tok/s ({p['plain']['baseline']})"
                 for p in points if p.get("plain")), ""]
    crossover = result.get("batch_crossover") or {}
    if crossover:
        rows = [[name, str(c["predicted_crossover"] or "none swept"), str(c["measured_crossover"] or "none swept"),
                 ", ".join(f"B={b}: {_f(v)}×" for b, v in c["predicted_speedup"].items())]
                for name, c in crossover.items()]
        lines += ["Crossover: the smallest swept batch size where the drafter's speedup falls below 1.", ""]
        lines += _table(["drafter", "predicted crossover", "measured crossover", "predicted speedup"], rows) + [""]
    return lines


def invariance_lines(costs: dict | None, settings: dict) -> list[str]:
    """The cost of batch-invariant forwards, measured side by side (eval/costs.py invariance_costs)."""
    if not costs:
        return []
    (one, wide), state = sorted(costs["slowdown"]), "on" if settings.get("invariant") else "off in this run"
    return ["", f"Batch-invariant target forwards ({state}; {settings.get('dtype')}): a 1-token step costs "
                f"{_f(costs['slowdown'][one])}× the ordinary kernels' ({1000 * costs['invariant'][one]:.1f} against "
                f"{1000 * costs['ordinary'][one]:.1f} ms), a verify over {wide} tokens {_f(costs['slowdown'][wide])}× "
                f"({1000 * costs['invariant'][wide]:.1f} against {1000 * costs['ordinary'][wide]:.1f} ms)."]


def engine_lines(result: dict) -> list[str]:
    """The oracle's decode phase against the (K+1)/V(K) limit: the decoder's own overhead, one line per oracle."""
    cost, lines = result.get("cost_model") or {}, []
    oracles = [d["name"] for d in result.get("drafters", []) if has(d.get("kind", ""), "ceiling")]
    for name in oracles:
        block = (cost.get("drafters") or {}).get(name)
        if not block:
            continue
        k, overall = block["k"], block["overall"]
        limit = (k + 1) / block["verify_ratio"]
        measured = overall.get("measured_decode_speedup", float("nan"))
        predicted = overall.get("predicted_decode_speedup")
        lines += ["", f"Engine overhead ({name}, decode phase): {_f(measured)}× against the (K+1)/V(K) limit "
                  f"{_f(limit)}× at K={k} ({_f(measured / limit)} of it) and the {_f(predicted)}× the cost model "
                  f"predicts from its cycles (efficiency {_f(overall.get('engine_efficiency'))})."]
    return lines


def write_report(result: dict, out_dir: str | Path) -> dict[str, Any]:
    """Write DIR/result.json, DIR/report.md and the PNG plots; return their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    data = json.loads(json.dumps(to_jsonable(result)))  # the report reads exactly what OUT.json holds
    plots = write_plots(data, out)
    json_path = write_json(result, out / "result.json")
    md = out / "report.md"
    write_text_atomic(md, markdown(data, plots))
    return {"json": json_path, "markdown": md, "plots": plots}
