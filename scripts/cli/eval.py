"""`draftsmith eval`: μ per domain and speed side by side against plain decoding and transformers' peers.

    draftsmith eval --target demo --drafter ngram --drafter mine=runs/eagle3 \
        --prompts code=../shared/data/eval/humaneval.jsonl --prompts builtin --limit 5 \
        --json out.json --report report/ [--sweep k=1,2,3,5,8] [--wandb]
"""
from __future__ import annotations

import sys

from draftsmith.serve.core.threads import THREADS_HELP


def add_arguments(parser) -> None:
    parser.add_argument("--target", default=None, help="HF folder, .gguf file, hub id, or `demo` (default); = target.spec")
    parser.add_argument("--drafter", action="append", default=[], metavar="[NAME=]SPEC",
                        help="ngram | ngram:max_n=8 | model:PATH | oracle | mtp (the target's own MTP layer) | a drafter "
                             "folder | hybrid:DIR or hybrid:mtp (n-gram "
                             "where the context holds a match, the folder's head elsewhere); each drafts a length "
                             "chosen per step unless SPEC:length=fixed; a folder with @tree (or "
                             "@tree:depth=5,top_k=4,total_tokens=24) drafts EAGLE-2 dynamic trees; NAME= labels it; "
                             "repeatable (default: ngram)")
    parser.add_argument("--prompts", action="append", default=[], metavar="[DOMAIN=]SOURCE",
                        help="JSONL file, HF datasets folder, `builtin` or `builtin:<domain>`; DOMAIN= sets the "
                             "domain of all its rows; repeatable (default: builtin)")
    parser.add_argument("--domain-field", default=None, help="row field holding the domain (default: domain)")
    parser.add_argument("--k", type=int, default=None,
                        help="draft tokens per cycle (default: the K the drafter folders record, else 5): every "
                             "cycle at length=fixed, at most otherwise")
    parser.add_argument("--temperature", type=float, default=None, help="default 0 (greedy)")
    parser.add_argument("--top-k", type=int, default=None)
    parser.add_argument("--top-p", type=float, default=None)
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default 128")
    parser.add_argument("--limit", type=int, default=None, help="at most N prompts per domain (= per_domain_limit)")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--sweep", action="append", default=[], metavar="AXIS=V1,V2,...",
                        help="re-run varying one setting: k, temperature, max_new_tokens, top_p, top_k, batch_size "
                             "(batched decoding against batched plain decoding); repeatable")
    parser.add_argument("--repeats", type=int, default=None,
                        help="time every method N times per prompt, interleaved, and keep the fastest run (default 1; "
                             "2-3 on a shared or noisy machine)")
    parser.add_argument("--no-peers", action="store_true", help="skip transformers' assisted generation")
    parser.add_argument("--no-cost-model", action="store_true", help="skip measuring c and verify ratios")
    parser.add_argument("--dtype", default=None, help="target compute dtype (default float32; = target.dtype)")
    parser.add_argument("--device", default=None, help="auto (default: cuda when available), cpu, cuda:N")
    parser.add_argument("--threads", type=int, default=None, help=THREADS_HELP)
    parser.add_argument("--json", default=None, metavar="OUT.json", help="write the result here")
    parser.add_argument("--report", default=None, metavar="DIR", help="write report.md, result.json and plots here")
    parser.add_argument("--wandb", action="store_true", help="log the result and plots to wandb (honours WANDB_MODE)")
    parser.add_argument("--wandb-project", default="draftsmith")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def load_eval_config(args):
    """EvalConfig from its defaults < the recipe's `eval:` section (or the whole file) < overrides < flags."""
    from draftsmith.eval.config import EvalConfig
    from draftsmith.serve.core.config import load_config

    flags = {"target.spec": args.target, "k": args.k, "temperature": args.temperature, "top_k": args.top_k,
             "top_p": args.top_p, "max_new_tokens": args.max_new_tokens, "per_domain_limit": args.limit,
             "seed": args.seed, "domain_field": args.domain_field, "target.dtype": args.dtype,
             "target.device": args.device, "target.threads": args.threads, "sweep": args.sweep or None,
             "repeats": args.repeats,
             "peers": False if args.no_peers else None, "cost_model": False if args.no_cost_model else None,
             "progress": False if args.quiet else None}
    return load_config(EvalConfig, config_file=args.config, section="eval", overrides=args.overrides, flags=flags)


def print_summary(result: dict, file=None) -> None:
    from draftsmith.eval.report import engine_lines, timing_line

    file = file or sys.stdout  # looked up at call time: sys.stdout may have been replaced since import
    print(f"target {result['target']['name']}: K={result['settings']['k']}, "
          f"T={result['settings']['temperature']}, plain {result['baseline']['tokens_per_second']:.1f} tok/s",
          file=file)
    for name, b in result["overall"].items():
        per = ", ".join(f"{d} {result['domains'][d][name]['mu']:.2f}" for d in result["domains"])
        print(f"  {name:<16} mu {b['mu']:.2f}  speedup {b['speedup']:.2f}x  ({per})", file=file)
    for name, by in (result.get("drafted_by") or {}).items():
        total = sum(by["overall"].values()) or 1
        parts: dict[str, int] = {}
        for reason, n in by["overall"].items():
            parts[reason.split(":")[0]] = parts.get(reason.split(":")[0], 0) + n
        print(f"  {name:<16} cycles drafted by " + ", ".join(f"{part} {n / total:.0%}" for part, n in parts.items()),
              file=file)
    for name, p in (result.get("peers") or {}).items():
        print(f"  {name:<16} mu {p['mu']:.2f}  speedup {p['speedup']:.2f}x", file=file)
    for line in engine_lines(result):
        print(f"  {line.strip()}", file=file)
    timing = timing_line(result["settings"])
    if timing:
        print(f"  {timing}", file=file)
    for axis, points in (result.get("sweeps") or {}).items():
        print(f"  sweep {axis}:", file=file)
        for point in points:
            cells = ", ".join(f"{name} mu {b['mu']:.2f} {b['speedup']:.2f}x" for name, b in point["overall"].items())
            print(f"    {axis}={point['value']}: {cells}", file=file)
    ex = result["exactness"]
    if ex.get("checked"):
        audit = ex.get("audit")
        why = (f" ({audit['rounding_flips']} rounding flips, {audit['unexplained']} unexplained)"
               if audit and ex["identical"] != ex["total"] else "")
        print(f"  exactness: {ex['identical']}/{ex['total']} identical to {ex.get('against', 'plain greedy decoding')}"
              f"{why}", file=file)


def run(args) -> int:
    from draftsmith.serve.drafters.spec import parse_named_specs
    from draftsmith.eval.report import write_json, write_report
    from draftsmith.eval.evaluate import evaluate

    from draftsmith.serve.core.files import check_output_path

    config = load_eval_config(args)  # a bad key, value or sweep fails here, before anything loads
    if args.json:
        check_output_path(args.json, what="--json file")
    if args.report:
        check_output_path(args.report, what="--report folder", folder=True)
    config.target.apply_threads()
    drafters = parse_named_specs(args.drafter or ["ngram"])
    result = evaluate(config.target.spec, drafters, args.prompts or ["builtin"], config)
    print_summary(result)
    plots = []
    if args.json:
        print(f"wrote {write_json(result, args.json)}")
    if args.report:
        from draftsmith.serve.core.config import save_config

        paths = write_report(result, args.report)
        save_config(config, args.report)
        plots = paths["plots"]
        print(f"wrote {paths['markdown']} and {len(plots)} plots")
    if args.wandb:
        from draftsmith.eval.tracking import log_to_wandb

        print(f"wandb run {log_to_wandb(result, plots, project=args.wandb_project, directory=args.report)}")
    ex = result["exactness"]
    if ex.get("checked") and ex["identical"] != ex["total"]:
        from draftsmith.eval.stats import exactness_verdict

        print(f"{ex['identical']}/{ex['total']} outputs identical to {ex.get('against', 'plain greedy decoding')}: "
              f"{exactness_verdict(ex)}", file=sys.stderr)
        # a divergence the target's precision does not explain is a lossy decoder: a failed evaluation, whatever
        # the speed; rounding flips alone are reported, not failed
        if (ex.get("audit") or {"unexplained": 1})["unexplained"]:
            return 1
    return 0
