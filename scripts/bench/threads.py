"""The thread policy on a busy machine: tokens/s of data build (batched self-distillation) and of eval
(plain and n-gram speculative decoding) with the machine as it is and with one core taken by a busy loop this
script starts, under the old policy (torch's default thread count) and the new one (serve/core/threads.py: the
default lowered to the cores idle at start), side by side in one process.

    .venv/bin/python scripts/bench/threads.py [--target demo] [--domains code,math,chat] [--max-new-tokens 32]
        [--repeats 1] [--json out.json]

"quiet" is the machine as it is when the script runs (say its load with the figures: `uptime` is printed);
"busy" adds one process spinning on a core. Each (machine, policy) cell is the best of --repeats, the cells
alternating so that drift in the background load spreads over all of them.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: the target's module imports torch
    from draftsmith.serve.core.target import Target

WORKLOADS = ("data build", "eval plain", "eval ngram")


def _uptime() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f}, {five:.2f}, {fifteen:.2f} ({os.cpu_count()} cores)"


class BusyCore:
    """A child process spinning on one core while the block runs."""

    def __enter__(self):
        self.proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        time.sleep(1.0)  # running, and visible to the idle-core measurement
        return self

    def __exit__(self, *exc):
        self.proc.terminate()
        self.proc.wait(timeout=10)


def build_tok_s(target: Target, args, out: Path) -> float:
    from draftsmith.data.build import build_dataset
    from draftsmith.data.config import DataBuildConfig
    from draftsmith.serve.core.target_config import TargetConfig

    config = DataBuildConfig(prompts=args.sources, per_domain_limit=args.per_domain, max_new_tokens=args.max_new_tokens,
                             batch_size=args.batch_size, temperature=0.0, target=TargetConfig(device="cpu"))
    return build_dataset(target, config, out_dir=out, progress=False, log=lambda _: None).tokens_per_second


def eval_tok_s(target: Target, args) -> tuple[float, float]:
    from draftsmith.eval.config import EvalConfig
    from draftsmith.eval.evaluate import evaluate

    config = EvalConfig(per_domain_limit=args.per_domain, max_new_tokens=args.max_new_tokens, peers=False,
                        hf_plain=False, cost_model=False, warmup=False, progress=False)
    result = evaluate(target, {"ngram": "ngram"}, args.sources, config)
    return result["baseline"]["tokens_per_second"], result["overall"]["ngram"]["tokens_per_second"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="demo")
    parser.add_argument("--domains", default="code,math,chat", help="built-in domains the prompts come from")
    parser.add_argument("--per-domain", type=int, default=1, help="prompts per domain")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=8, help="data build: rows decoding at once")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    args.sources = [f"builtin:{d}" for d in args.domains.split(",")]

    import datasets
    import torch

    from draftsmith.serve.core.target import load_target
    from draftsmith.serve.core.threads import apply_threads, torch_default_threads

    datasets.disable_progress_bars()
    default = torch_default_threads()
    print(f"before: {_uptime()}; torch default {default} threads", flush=True)
    target = load_target(args.target, dtype="float32", device="cpu")
    cells: dict[tuple[str, str, str], dict] = {}
    with tempfile.TemporaryDirectory(prefix="bench_threads-") as tmp:
        for repeat in range(args.repeats):
            for machine in ("quiet", "busy"):
                busy = BusyCore() if machine == "busy" else None
                if busy:
                    busy.__enter__()
                try:
                    for policy in ("old", "new"):
                        if policy == "old":
                            torch.set_num_threads(default)
                            threads, idle = default, None
                        else:
                            choice = apply_threads(None)
                            threads, idle = choice.threads, choice.idle
                        figures = {"data build": build_tok_s(target, args, Path(tmp) / f"{repeat}-{machine}-{policy}")}
                        figures["eval plain"], figures["eval ngram"] = eval_tok_s(target, args)
                        for workload, tok_s in figures.items():
                            cell = cells.setdefault((workload, machine, policy), {"tok_s": 0.0})
                            if tok_s > cell["tok_s"]:
                                cell.update(tok_s=tok_s, threads=threads, idle=idle)
                        print(f"  {machine:<5} {policy} policy, {threads} thread(s)"
                              f"{'' if idle is None else f' ({idle:.1f} cores idle)'}: "
                              + ", ".join(f"{w} {v:.1f} tok/s" for w, v in figures.items()), flush=True)
                finally:
                    if busy:
                        busy.__exit__()
    print(f"after: {_uptime()}")
    print(f"\ntok/s, best of {args.repeats}; {len(args.sources) * args.per_domain} prompts, "
          f"{args.max_new_tokens} new tokens each; target {target.name}, fp32 CPU")
    header = f"{'workload':<11} {'machine':<6} {'old policy':>17} {'new policy':>17} {'new/old':>8}"
    print(header + "\n" + "-" * len(header))
    for workload in WORKLOADS:
        for machine in ("quiet", "busy"):
            old, new = cells[workload, machine, "old"], cells[workload, machine, "new"]
            print(f"{workload:<11} {machine:<6} {old['tok_s']:>7.1f} ({old['threads']} thr) "
                  f"{new['tok_s']:>7.1f} ({new['threads']} thr) {new['tok_s'] / old['tok_s']:>7.2f}x")
    print("\nbusy / quiet (how much one busy core costs):")
    for workload in WORKLOADS:
        ratios = [cells[workload, "busy", p]["tok_s"] / cells[workload, "quiet", p]["tok_s"] for p in ("old", "new")]
        print(f"  {workload:<11} old policy {ratios[0]:.2f}x, new policy {ratios[1]:.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps({"load_after": os.getloadavg(), "torch_default_threads": default,
                                               "args": {k: v for k, v in vars(args).items()},
                                               "cells": [{"workload": w, "machine": m, "policy": p, **c}
                                                         for (w, m, p), c in cells.items()]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
