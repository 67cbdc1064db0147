"""Draft length per step and the hybrid drafter, against fixed K and transformers' prompt lookup, in one run.

For each trained head given (EAGLE-3, Medusa, ...): the head at fixed K and with its per-step length, and
`hybrid:DIR`; always the n-gram drafter at fixed K and per step, and transformers' prompt lookup at the same K.
Prints per domain the speedup over plain decoding and μ of every method, which one won, and the cost model's
prediction beside the measurement; every figure is a ratio measured in this run (methods interleaved per
prompt), with torch pinned to --threads (default 1).

    python scripts/bench/policy.py --head eagle3=runs/demo/eagle3/drafter --head medusa=runs/demo/medusa/drafter \
        --prompts runs/demo/prompts_eval.jsonl --max-new-tokens 128 --k 5 --json runs/bench-policy.json
"""
from __future__ import annotations

import argparse
import math
import os
from pathlib import Path


def methods(heads: dict[str, str], *, with_fixed: bool = True) -> dict[str, str]:
    """name -> drafter spec for every method the benchmark compares."""
    out = {"ngram-fixed": "ngram:length=fixed"} if with_fixed else {}
    out["ngram"] = "ngram"
    for name, folder in heads.items():
        if with_fixed:
            out[f"{name}-fixed"] = f"{folder}:length=fixed"
        out[name] = folder
        out[f"hybrid-{name}"] = f"hybrid:{folder}"
    return out


def _f(x, digits: int = 2) -> str:
    return f"{x:.{digits}f}" if isinstance(x, (int, float)) and math.isfinite(x) else "–"


def table(result: dict) -> str:
    """Per domain: speedup (μ) of every drafter and peer; then the winner with predicted vs measured."""
    names = [d["name"] for d in result["drafters"]]
    peers = list(result.get("peers") or {})
    width = max(14, *(len(n) + 2 for n in names + peers))
    lines = [f"{'domain':<14}" + "".join(f"{n:>{width}}" for n in names + peers)]
    for domain in list(result["domains"]) + ["overall"]:
        per = result["overall"] if domain == "overall" else result["domains"][domain]
        cells = [f"{_f(per[n]['speedup'])}x ({_f(per[n]['mu'])})" for n in names]
        for p in peers:
            block = result["peers"][p] if domain == "overall" else result["peers"][p]["domains"][domain]
            cells.append(f"{_f(block['speedup'])}x ({_f(block['mu'])})")
        lines.append(f"{domain:<14}" + "".join(f"{c:>{width}}" for c in cells))
    lines += ["", f"{'domain':<14}{'winner':>18}{'length':>8}{'measured':>10}{'predicted':>10}{'runner-up':>26}"]
    for domain, w in result["winners"].items():
        runner = f"{w['runner_up']} {_f(w['runner_up_speedup'])}x" if w["runner_up"] else "–"
        lines.append(f"{domain:<14}{w['drafter']:>18}{w['length']:>8}{_f(w['speedup']) + 'x':>10}"
                     f"{_f(w['predicted_speedup']) + 'x':>10}{runner:>26}")
    drafted = {n: _f(result["overall"][n].get("drafted_per_cycle")) for n in names}
    lines += ["", "drafted tokens per cycle: " + ", ".join(f"{n} {d}" for n, d in drafted.items())]
    ex = result["exactness"]
    if ex.get("checked"):
        lines.append(f"exactness at T=0: {ex['identical']}/{ex['total']} outputs identical to plain greedy")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--head", action="append", default=[], metavar="NAME=DIR", help="a trained drafter folder")
    parser.add_argument("--prompts", action="append", default=[], help="prompt sources (default: builtin)")
    parser.add_argument("--target", default="demo")
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--limit", type=int, default=None, help="prompts per domain")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-fixed", action="store_true", help="skip the fixed-K variants")
    parser.add_argument("--json", default=None, metavar="OUT.json")
    parser.add_argument("--report", default=None, metavar="DIR")
    args = parser.parse_args()

    from draftsmith.eval.config import EvalConfig
    from draftsmith.eval.report import write_json, write_report
    from draftsmith.eval.evaluate import evaluate
    from draftsmith.serve.core.target_config import TargetConfig

    heads = dict(h.split("=", 1) if "=" in h else (Path(h).parent.name, h) for h in args.head)
    config = EvalConfig(target=TargetConfig(spec=args.target, threads=args.threads), k=args.k,
                        max_new_tokens=args.max_new_tokens, per_domain_limit=args.limit,
                        temperature=args.temperature, hf_plain=False, progress=True)
    result = evaluate(config.target.spec, methods(heads, with_fixed=not args.no_fixed), args.prompts or ["builtin"], config)
    print(f"target {result['target']['name']}, K={args.k}, T={args.temperature}, {args.max_new_tokens} new tokens, "
          f"{result['settings']['prompts_total']} prompts, torch threads {args.threads}, load {os.getloadavg()[0]:.1f}")
    print(table(result))
    if args.json:
        print(f"wrote {write_json(result, args.json)}")
    if args.report:
        print(f"wrote {write_report(result, args.report)['markdown']}")


if __name__ == "__main__":
    main()
