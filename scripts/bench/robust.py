"""Robustness: every drafter on public prompt sets nothing in the project was tuned on, side by side.

The sets (each a domain group of one eval run, every method interleaved per prompt): GSM8K's test questions and
HumanEval's prompts (../shared/data/eval), the roleplay and general prompts of GPTeacher and self-instruct
(../shared/data/train/prompts.jsonl; the demo trains on the built-in prompts, not these), the demo's held-out
prompts when a demo ran, and, given `--specbench PATH`, Spec-Bench's question.jsonl (github.com/hemingkx/Spec-Bench,
data/spec_bench/question.jsonl: MT-bench turns, translation, summarization, QA, math reasoning, RAG). Prints each
drafter's speedup and μ per set and domain, and for a hybrid whether it held the better of its two parts.
`--sets demo,specbench` runs only those.

    python -m draftsmith.bench.robust --drafter ngram --drafter eagle3=runs/demo/eagle3/drafter \\
        --drafter hybrid=hybrid:runs/demo/eagle3/drafter --specbench /path/to/question.jsonl --limit 2 --threads 1
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from draftsmith.data.prompts import PromptRow, limit_per_domain, read_prompts
from draftsmith.eval.config import EvalConfig
from draftsmith.eval.evaluate import evaluate
from draftsmith.eval.report import write_json
from draftsmith.serve.core.target_config import TargetConfig

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "data"
SPECBENCH_TASKS = ("translation", "summarization", "qa", "math_reasoning", "rag")  # the rest are MT-bench's
SETS = ("gsm8k", "humaneval", "gpteacher", "specbench", "demo")
HELD_OUT = ROOT / "runs/demo/prompts_eval.jsonl"  # what `make demo` holds out


def public_rows(limit: int, specbench: str | None, held_out: str | None,
                sets: tuple[str, ...] = SETS) -> list[PromptRow]:
    """Rows tagged `set/domain`, at most `limit` per domain, of `sets` (specbench and demo only where their files
    are given)."""
    rows: list[PromptRow] = []

    def add(name: str, found: list[PromptRow], domain=lambda r: r.domain) -> None:
        rows.extend(PromptRow(id=f"{name}/{r.id}", domain=f"{name}/{domain(r)}", messages=r.messages) for r in found)

    if "gsm8k" in sets:
        add("gsm8k", read_prompts([f"math={SHARED / 'eval/gsm8k_test.jsonl'}"], per_domain_limit=limit))
    if "humaneval" in sets:
        add("humaneval", read_prompts([f"code={SHARED / 'eval/humaneval.jsonl'}"], per_domain_limit=limit))
    if "gpteacher" in sets:
        train = read_prompts([str(SHARED / "train/prompts.jsonl")], per_domain_limit=limit)
        add("gpteacher", [r for r in train if r.domain in ("roleplay", "general")])
    if specbench and "specbench" in sets:
        add("specbench", read_prompts([specbench], domain_field="category"),
            domain=lambda r: r.domain if r.domain in SPECBENCH_TASKS else "multiturn")
        rows = limit_per_domain(rows, limit)  # Spec-Bench's domains are known once renamed
    if held_out and "demo" in sets:
        add("demo", read_prompts([held_out], per_domain_limit=limit))
    return rows


def held_out_file(given: str | None) -> str | None:
    """The demo's held-out prompts: the file given (it must exist), else the demo's own where a demo ran; a run
    without them says so instead of leaving the set out silently."""
    if given:
        if not Path(given).is_file():
            sys.exit(f"robust: --held-out {given}: no such file")
        return given
    if HELD_OUT.is_file():
        return str(HELD_OUT)
    print(f"robust: no demo held-out set ({HELD_OUT} is absent: run `make demo` or pass --held-out)", file=sys.stderr)
    return None


def hybrid_holds(result: dict, hybrid: str, parts: tuple[str, str], domain: str | None) -> str:
    """'μ ok / speed ok' against the better part in `domain` (None: overall), within the run's timing spread."""
    block = result["domains"][domain] if domain else result["overall"]
    mu = max(block[p]["mu"] for p in parts)
    speed = max(block[p]["speedup"] for p in parts)
    h = block[hybrid]
    return f"μ {h['mu'] / mu:.2f} of the better part, speedup {h['speedup'] / speed:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="demo")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--drafter", action="append", default=[], metavar="[NAME=]SPEC")
    parser.add_argument("--specbench", default=None, metavar="question.jsonl")
    parser.add_argument("--held-out", default=None, help=f"the demo's held-out prompts (default: {HELD_OUT})")
    parser.add_argument("--sets", default=None, help=f"comma-separated, of {', '.join(SETS)} (default: every set "
                        "whose prompts are at hand)")
    parser.add_argument("--limit", type=int, default=2, help="prompts per domain of each set")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--k", type=int, default=None, help="draft tokens per cycle (default: what the folders record)")
    parser.add_argument("--cost-model", action="store_true",
                        help="fit the cost model and print each drafter's best fixed K (what `length=fixed` is held to)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", default=None, metavar="OUT.json")
    args = parser.parse_args()
    from draftsmith.serve.drafters.spec import parse_drafter_spec, parse_named_specs
    from draftsmith.serve.methods.registry import has

    drafters = parse_named_specs(args.drafter or ["ngram"])
    sets = tuple(s for s in (args.sets or ",".join(SETS)).split(",") if s)
    if not sets or set(sets) - set(SETS):
        sys.exit(f"robust: --sets {args.sets}: choose from {', '.join(SETS)}")
    if args.sets and "specbench" in sets and not args.specbench:
        sys.exit("robust: --sets specbench needs --specbench question.jsonl")
    rows = public_rows(args.limit, args.specbench, held_out_file(args.held_out) if "demo" in sets else None, sets)
    config = EvalConfig(target=TargetConfig(spec=args.target, dtype=args.dtype, threads=args.threads),
                        max_new_tokens=args.max_new_tokens, repeats=args.repeats, peers=False, cost_model=args.cost_model,
                        k=args.k)
    result = evaluate(args.target, drafters, rows, config)
    names = list(result["overall"])
    print(f"\n{result['target']['name']} {args.dtype}, {len(rows)} prompts, {args.max_new_tokens} tokens, "
          f"{args.threads} thread(s), repeats {args.repeats}; timing spread {result['settings']['timing_spread']}")
    print(f"{'set/domain':<26}" + "".join(f"{n:>22}" for n in names) + "   (speedup, μ)")
    for domain, block in list(result["domains"].items()) + [("all", result["overall"])]:
        print(f"{domain:<26}" + "".join(f"{block[n]['speedup']:>13.2f}x {block[n]['mu']:>6.2f}" for n in names))
    for hybrid, by in (result.get("drafted_by") or {}).items():
        spec = drafters[hybrid]
        head = next((n for n, s in drafters.items() if n != hybrid and s == spec.partition(":")[2]), None)
        lookup = next((n for n, s in drafters.items() if has(parse_drafter_spec(s).kind, "lookup")), None)
        if head and lookup:
            print(f"\n{hybrid} against the better of {lookup} and {head}:")
            for domain in list(result["domains"]) + [None]:
                print(f"  {domain or 'all':<24} {hybrid_holds(result, hybrid, (lookup, head), domain)}")
        print(f"{hybrid} cycles: " + json.dumps(by["overall"]))
    fitted = (result.get("cost_model") or {}).get("drafters") or {}
    for name, block in fitted.items():
        best = block["overall"]["best_k"]
        print(f"cost model: {name} at a fixed K pays most at K={best['k']} (predicted {best['predicted_speedup']:.2f}x)")
    if args.json:
        write_json(result, args.json)


if __name__ == "__main__":
    main()
