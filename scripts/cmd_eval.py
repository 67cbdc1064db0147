"""`draftsmith eval`: μ per domain and speed side by side against plain decoding and transformers' peers.

    draftsmith eval --target demo --drafter ngram --drafter mine=runs/eagle3 \
        --prompts code=../shared/data/eval/humaneval.jsonl --prompts builtin --limit 5 \
        --json out.json --report report/ [--sweep k=1,2,3,5,8] [--wandb]
"""
from __future__ import annotations

import sys
from pathlib import Path


def add_arguments(parser) -> None:
    parser.add_argument("--target", default="demo", help="HF folder, .gguf file, hub id, or `demo` (default)")
    parser.add_argument("--drafter", action="append", default=[], metavar="[NAME=]SPEC",
                        help="ngram | ngram:max_n=3 | model:PATH | oracle | a drafter folder; a folder with @tree "
                             "(or @tree:depth=5,top_k=4,total_tokens=24) drafts EAGLE-2 dynamic trees; NAME= "
                             "labels it; repeatable (default: ngram)")
    parser.add_argument("--prompts", action="append", default=[], metavar="[DOMAIN=]SOURCE",
                        help="JSONL file, HF datasets folder, `builtin` or `builtin:<domain>`; DOMAIN= sets the "
                             "domain of all its rows; repeatable (default: builtin)")
    parser.add_argument("--domain-field", default=None, help="row field holding the domain (default: domain)")
    parser.add_argument("--k", type=int, default=None,
                        help="draft tokens per cycle (default: the K the drafter folders record, else 5)")
    parser.add_argument("--temperature", type=float, default=None, help="default 0 (greedy)")
    parser.add_argument("--top-k", type=int, default=None)
    parser.add_argument("--top-p", type=float, default=None)
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default 128")
    parser.add_argument("--limit", type=int, default=None, help="at most N prompts per domain")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--sweep", action="append", default=[], metavar="AXIS=V1,V2,...",
                        help="re-run varying one setting: k, temperature, max_new_tokens, top_p, top_k; repeatable")
    parser.add_argument("--no-peers", action="store_true", help="skip transformers' assisted generation")
    parser.add_argument("--no-cost-model", action="store_true", help="skip measuring c and verify ratios")
    parser.add_argument("--dtype", default=None, help="target dtype (default float32)")
    parser.add_argument("--device", default=None, help="default cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (1 resists a busy machine)")
    parser.add_argument("--json", default=None, metavar="OUT.json", help="write the result here")
    parser.add_argument("--report", default=None, metavar="DIR", help="write report.md, result.json and plots here")
    parser.add_argument("--wandb", action="store_true", help="log the result and plots to wandb (honours WANDB_MODE)")
    parser.add_argument("--wandb-project", default="draftsmith")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def _flag_overrides(args) -> list[str]:
    """CLI flags as config overrides; they win over the YAML recipe and positional overrides."""
    table = {"k": args.k, "temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p,
             "max_new_tokens": args.max_new_tokens, "limit": args.limit, "seed": args.seed,
             "domain_field": args.domain_field, "dtype": args.dtype, "device": args.device,
             "threads": args.threads}
    out = [f"{key}={value}" for key, value in table.items() if value is not None]
    if args.sweep:
        out.append("sweep=[" + ",".join(f"'{s}'" for s in args.sweep) + "]")
    if args.no_peers:
        out.append("peers=false")
    if args.no_cost_model:
        out.append("cost_model=false")
    if args.quiet:
        out.append("progress=false")
    return out


def _section(config_file: str | None) -> str | None:
    """Read the `eval:` section of a recipe that has one; a flat file is an eval config as a whole."""
    if config_file is None or not Path(config_file).is_file():
        return None
    from omegaconf import OmegaConf

    return "eval" if "eval" in OmegaConf.load(config_file) else None


def load_eval_config(args):
    from eval.config import EvalConfig
    from serve.config import load_config

    return load_config(EvalConfig, config_file=args.config, section=_section(args.config),
                       overrides=list(args.overrides) + _flag_overrides(args))


def print_summary(result: dict, file=None) -> None:
    file = file or sys.stdout  # looked up at call time: sys.stdout may have been replaced since import
    print(f"target {result['target']['name']}: K={result['settings']['k']}, "
          f"T={result['settings']['temperature']}, plain {result['baseline']['tokens_per_second']:.1f} tok/s",
          file=file)
    for name, b in result["overall"].items():
        per = ", ".join(f"{d} {result['domains'][d][name]['mu']:.2f}" for d in result["domains"])
        print(f"  {name:<16} mu {b['mu']:.2f}  speedup {b['speedup']:.2f}x  ({per})", file=file)
    for name, p in (result.get("peers") or {}).items():
        print(f"  {name:<16} mu {p['mu']:.2f}  speedup {p['speedup']:.2f}x", file=file)
    ex = result["exactness"]
    if ex.get("checked"):
        print(f"  exactness: {ex['identical']}/{ex['total']} identical to plain greedy", file=file)


def run(args) -> int:
    from serve.drafters.spec import parse_named_specs
    from eval.report import write_json, write_report
    from eval.runner import evaluate
    from eval.sweeps import parse_sweeps

    config = load_eval_config(args)
    parse_sweeps(config.sweep)  # fail on a bad sweep before loading anything
    drafters = parse_named_specs(args.drafter or ["ngram"])
    result = evaluate(args.target, drafters, args.prompts or ["builtin"], config)
    print_summary(result)
    plots = []
    if args.json:
        print(f"wrote {write_json(result, args.json)}")
    if args.report:
        from serve.config import save_config

        paths = write_report(result, args.report)
        save_config(config, args.report)
        plots = paths["plots"]
        print(f"wrote {paths['markdown']} and {len(plots)} plots")
    if args.wandb:
        from eval.tracking import log_to_wandb

        print(f"wandb run {log_to_wandb(result, plots, project=args.wandb_project, directory=args.report)}")
    ex = result["exactness"]
    # a lossy decoder is a failed evaluation, whatever the speed
    return 1 if ex.get("checked") and ex["identical"] != ex["total"] else 0
