"""Self-distillation's attention on the default target: torch's SDPA kernel against grouped matmuls, side by side.

    .venv/bin/python scripts/bench/distill_attention.py [--per-domain 20] [--max-new-tokens 128] [--slots 64]
        [--dtype bfloat16] [--threads 1] [--repeats 2] [--json runs/bench_distill_attention.json]

One process, one target, the arms alternating per repeat: `sdpa` (what `suspended` chose before
serve/core/attention.py `grouped_attention`) and `grouped` (what it chooses on a CPU in bf16/fp16). Each arm runs
the demo probe's target step (scripts/demo/machine.py `probe_target`: --slots rows over 64 cached tokens) and a
continuous-batching build of the built-in prompts (data/generate.py, greedy), and reports: build tokens/s, the
build's rate against the probe's --slots-row step rate, the probe step's share of the CPU's measured matmul
throughput (the linears' FLOPs of --slots rows over the step's seconds, against `matmul_gflops` of the dtype and
threads), and the rows whose answers differ between the arms (in bf16 any kernel change moves near-ties).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time

from draftsmith.bench.generate import build_prompts, continuous_generate, differing


@contextlib.contextmanager
def arm(name: str):
    """Inside: `suspended` picks SDPA (name 'sdpa') or what it picks by itself ('grouped')."""
    from draftsmith.serve.core import attention

    wanted = attention.grouped_wanted
    if name == "sdpa":
        attention.grouped_wanted = lambda model: False
    try:
        yield
    finally:
        attention.grouped_wanted = wanted


def linear_flops_per_row(model) -> int:
    """2 x the weights of every linear layer (the lm_head included): a decode step's FLOPs per row, attention aside."""
    import torch

    return 2 * sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="demo")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--per-domain", type=int, default=20, help="first N built-in prompts per domain")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--slots", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    import torch

    from draftsmith.demo.machine import matmul_gflops, probe_target
    from draftsmith.serve.core.target import load_target

    torch.set_num_threads(args.threads)
    target = load_target(args.target, dtype=args.dtype)
    prompts = build_prompts(target, args.per_domain)
    gflops = matmul_gflops(args.dtype, args.threads)
    flops = linear_flops_per_row(target.model) * args.slots
    figures = {"target": target.name, "dtype": args.dtype, "threads": args.threads, "slots": args.slots,
               "prompts": len(prompts), "max_new_tokens": args.max_new_tokens, "matmul_gflops": round(gflops, 1),
               "load_before": os.getloadavg(), "arms": {"sdpa": [], "grouped": []}}
    answers = {}
    for repeat in range(args.repeats):
        for name in ("sdpa", "grouped"):
            with arm(name):
                rates = probe_target(target, batch=args.slots, prefill_tokens=1024)
                start = time.perf_counter()
                answers[name] = continuous_generate(target, prompts, slots=args.slots,
                                                    max_new_tokens=args.max_new_tokens)
                seconds = time.perf_counter() - start
            tokens = sum(map(len, answers[name]))
            run = {"build_tokens_per_second": round(tokens / seconds, 1), "build_seconds": round(seconds, 1),
                   "generated_tokens": tokens, "probe_step_ms": round(rates.batch_step_seconds * 1e3, 1),
                   "probe_step_tokens_per_second": round(rates.generate_tokens_per_second, 1),
                   "build_against_probe": round(tokens / seconds / rates.generate_tokens_per_second, 2),
                   "step_share_of_matmul": round(flops / rates.batch_step_seconds / 1e9 / gflops, 3),
                   "load": os.getloadavg()}
            figures["arms"][name].append(run)
            print(f"repeat {repeat} {name}: {json.dumps(run)}", file=sys.stderr, flush=True)
    best = {name: max(r["build_tokens_per_second"] for r in runs) for name, runs in figures["arms"].items()}
    speedups = [g["build_tokens_per_second"] / s["build_tokens_per_second"]
                for s, g in zip(figures["arms"]["sdpa"], figures["arms"]["grouped"])]
    figures["build_speedup_per_repeat"] = [round(x, 2) for x in speedups]
    figures["build_speedup_median"] = round(statistics.median(speedups), 2)
    figures["rows_differing"] = differing(answers["sdpa"], answers["grouped"])["rows"]
    print(f"build tokens/s: sdpa {best['sdpa']}, grouped {best['grouped']} (x{figures['build_speedup_median']}, "
          f"per repeat {figures['build_speedup_per_repeat']}); answers differing: {figures['rows_differing']} of "
          f"{len(prompts)}")
    if args.json:
        from draftsmith.eval.report import write_json

        write_json(figures, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
