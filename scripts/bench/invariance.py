"""What batch-invariant forwards buy and cost: exactness and speed with them and without, side by side.

One target (default: the embedded one in bf16), one process. Per prompt, every method (plain decoding and each
drafter) runs with the invariant kernels, then with the ordinary ones, switched in place, so the machine's noise
hits both alike. For each mode it prints plain decoding's tokens/s, each drafter's μ, speedup over plain decoding
of the same mode and outputs identical to it, and the exactness audit of every divergence (eval/audit.py); then
the cost of invariance: each method's tokens/s with it over without.

    python -m draftsmith.bench.invariance --prompts runs/demo/prompts_eval.jsonl --drafter ngram \\
        --drafter eagle3=runs/demo/eagle3/drafter --drafter hybrid=hybrid:runs/demo/eagle3/drafter --threads 1
"""
from __future__ import annotations

import argparse
import json

import torch

from draftsmith.data.prompts import read_prompts
from draftsmith.eval import stats
from draftsmith.eval.drafters import BASELINE, build_entries
from draftsmith.eval.prompts import prepare_prompts
from draftsmith.eval.runner import Decoding, exactness_block, mark_exactness, run_methods
from draftsmith.serve.core.invariant import make_invariant, make_variant
from draftsmith.serve.core.target import load_target
from draftsmith.serve.drafters.spec import parse_named_specs

MODES = {"invariant": make_invariant, "ordinary": make_variant}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="demo")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--prompts", default="builtin")
    parser.add_argument("--limit", type=int, default=2, help="prompts per domain")
    parser.add_argument("--drafter", action="append", default=[], metavar="[NAME=]SPEC")
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--modes", default="invariant,ordinary", help="which forwards to run, comma-separated")
    parser.add_argument("--json", default=None, metavar="OUT.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target = load_target(args.target, dtype=args.dtype, invariant="on")
    prompts = prepare_prompts(target.tokenizer, read_prompts([args.prompts], per_domain_limit=args.limit))
    entries = build_entries(target, parse_named_specs(args.drafter or ["ngram"]), max_new_tokens=args.max_new_tokens)
    names = [e.name for e in entries]
    decoding = Decoding(k=args.k, temperature=0.0, top_k=0, top_p=1.0, max_new_tokens=args.max_new_tokens, seed=0)
    modes = {mode: MODES[mode] for mode in args.modes.split(",")}
    records = {mode: {name: [] for name in [BASELINE] + names} for mode in modes}
    for i, prompt in enumerate(prompts):
        for mode, switch in modes.items():
            switch(target.model)
            one = run_methods(target, entries, [], [prompt], decoding, warmup=i == 0, progress=False,
                              repeats=args.repeats)
            for name, recs in one.items():
                records[mode][name] += recs
        print(f"prompt {i + 1}/{len(prompts)} ({prompt.domain})", flush=True)

    out = {"target": target.name, "dtype": args.dtype, "threads": args.threads, "prompts": len(prompts),
           "max_new_tokens": args.max_new_tokens, "k": args.k, "repeats": args.repeats, "modes": {}}
    for mode, switch in modes.items():
        switch(target.model)  # the audit computes the target's own logits in this mode
        mark_exactness(records[mode], names)
        block = exactness_block(records[mode], names, 0.0, target=target)
        plain = records[mode][BASELINE]
        out["modes"][mode] = {
            "plain_tokens_per_second": stats.tokens_per_second(plain),
            "drafters": {n: {"mu": stats.mu(records[mode][n]), "speedup": stats.speedup(plain, records[mode][n]),
                             "tokens_per_second": stats.tokens_per_second(records[mode][n]),
                             **block["by_drafter"][n], **block["audit"]["by_drafter"][n]} for n in names},
            "identical": block["identical"], "total": block["total"],
            "rounding_flips": block["audit"]["rounding_flips"], "unexplained": block["audit"]["unexplained"],
            "divergences": block["audit"]["divergences"],
            "timing_spread": stats.timing_spread(rec for recs in records[mode].values() for rec in recs)}
    if len(modes) == 2:
        inv, ordinary = out["modes"]["invariant"], out["modes"]["ordinary"]
        out["cost"] = {BASELINE: inv["plain_tokens_per_second"] / ordinary["plain_tokens_per_second"],
                       **{n: inv["drafters"][n]["tokens_per_second"] / ordinary["drafters"][n]["tokens_per_second"]
                          for n in names}}

    print(f"\n{target.name} in {args.dtype}, {args.threads} thread(s), {len(prompts)} prompts x "
          f"{args.max_new_tokens} tokens, K={args.k}, fastest of {args.repeats} runs")
    for mode, m in out["modes"].items():
        print(f"\n{mode} forwards: plain {m['plain_tokens_per_second']:.1f} tok/s; {m['identical']}/{m['total']} "
              f"identical to plain greedy ({m['rounding_flips']} rounding flips, {m['unexplained']} unexplained); "
              f"repeats differed by {100 * m['timing_spread']:.1f}%")
        print(f"  {'drafter':<10} {'mu':>5} {'speedup':>8} {'identical':>10} {'flips':>6} {'unexpl.':>8}")
        for n, d in m["drafters"].items():
            print(f"  {n:<10} {d['mu']:>5.2f} {d['speedup']:>7.2f}x {d['identical']:>5}/{d['total']:<4} "
                  f"{d['rounding flip']:>6} {d['unexplained']:>8}")
        for d in m["divergences"]:
            gap = "-" if d["gap"] is None else f"{d['gap']:.3f}"
            rounding = "-" if d["rounding"] is None else f"{d['rounding']:.3f}"
            print(f"    {d['drafter']} on {d['id']}: token {d['position']}, gap {gap}, rounding {rounding}: {d['kind']}")
    if "cost" in out:
        print("\ntokens/s with invariant forwards over ordinary ones: "
              + ", ".join(f"{n} {r:.3f}" for n, r in out["cost"].items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
