"""Self-distillation's kernels on the default target: torch's SDPA against grouped matmuls, linears packed or not.

    .venv/bin/python scripts/bench/distill_attention.py [--per-domain 20] [--max-new-tokens 128] [--slots 64]
        [--dtype bfloat16] [--threads 1] [--repeats 2] [--arms grouped,packed]
        [--json runs/bench_distill_attention.json]

One process, one target, the arms alternating per repeat: `sdpa` (torch's SDPA kernel, F.linear: what `suspended`
chose before serve/core/attention.py `grouped_attention`), `grouped` (grouped matmuls, F.linear: before bf16
linears were packed) and `packed` (grouped matmuls and oneDNN's packed linears: what `suspended` chooses on a CPU in
bf16, serve/core/packed.py `packs_bf16`). Each arm runs the demo probe's target step (scripts/demo/machine.py
`probe_target`: --slots rows over 64 cached tokens) and a continuous-batching build of the built-in prompts
(data/generate.py, greedy), and reports: build tokens/s, the build's rate against the probe's --slots-row step rate,
the probe step's share of the CPU's measured matmul throughput (the linears' FLOPs of --slots rows over the step's
seconds, against `matmul_gflops` of the dtype and threads), and the rows whose answers differ from the first arm's
(in bf16 any kernel change moves near-ties).
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


ARMS = ("sdpa", "grouped", "packed")


@contextlib.contextmanager
def arm(name: str, model):
    """Inside: `suspended` picks SDPA ('sdpa') or what it picks by itself ('grouped', 'packed'), with the linears
    packed in 'packed' only."""
    from draftsmith.serve.core import attention
    from draftsmith.serve.core.packed import remember_setting

    wanted = attention.grouped_wanted
    if name == "sdpa":
        attention.grouped_wanted = lambda model: False
    remember_setting(model, "auto" if name == "packed" else "off")
    try:
        yield
    finally:
        attention.grouped_wanted = wanted
        remember_setting(model, "auto")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="demo")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--per-domain", type=int, default=20, help="first N built-in prompts per domain")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--slots", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--arms", default="grouped,packed", help=f"two or more of {','.join(ARMS)}")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    arms = args.arms.split(",")
    if len(arms) < 2 or set(arms) - set(ARMS):
        parser.error(f"--arms: two or more of {', '.join(ARMS)}")
    import torch

    from draftsmith.demo.machine import linear_flops_per_row, matmul_gflops, probe_target
    from draftsmith.serve.core.target import load_target

    torch.set_num_threads(args.threads)
    target = load_target(args.target, dtype=args.dtype)
    prompts = build_prompts(target, args.per_domain)
    gflops = matmul_gflops(args.dtype, args.threads)
    flops = linear_flops_per_row(target.model) * args.slots
    figures = {"target": target.name, "dtype": args.dtype, "threads": args.threads, "slots": args.slots,
               "prompts": len(prompts), "max_new_tokens": args.max_new_tokens, "matmul_gflops": round(gflops, 1),
               "load_before": os.getloadavg(), "arms": {name: [] for name in arms}}
    answers = {}
    for repeat in range(args.repeats):
        for name in arms:
            with arm(name, target.model):
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
    first = arms[0]
    for name in arms[1:]:
        speedups = [b["build_tokens_per_second"] / a["build_tokens_per_second"]
                    for a, b in zip(figures["arms"][first], figures["arms"][name])]
        figures[f"{name}_build_speedup_per_repeat"] = [round(x, 2) for x in speedups]
        figures[f"{name}_build_speedup_median"] = round(statistics.median(speedups), 2)
        figures[f"{name}_rows_differing"] = differing(answers[first], answers[name])["rows"]
        print(f"build tokens/s: {first} {best[first]}, {name} {best[name]} (x{statistics.median(speedups):.2f}, "
              f"per repeat {figures[f'{name}_build_speedup_per_repeat']}); answers differing: "
              f"{figures[f'{name}_rows_differing']} of {len(prompts)}")
    if args.json:
        from draftsmith.eval.report import write_json

        write_json(figures, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
