"""Decoder benchmark: oracle speedup vs its limit for K = 1..8, n-gram on code editing and free writing.

Runs are interleaved in one process (plain, speculative, plain, ...) so the machine's noise hits both sides;
every figure printed is a ratio measured in this run.

    python scripts/bench/decoder.py [--target demo] [--max-new-tokens 128] [--threads 2]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from draftsmith.serve.decoding import plain_generate, speculative_generate
from draftsmith.serve.drafters import build_drafter
from draftsmith.serve.core.costs import measure_verify_costs
from draftsmith.serve.core.prompts import encode_prompt
from draftsmith.serve.core.target import Target, load_target

CODE_EDIT = ("Rename the variable `total` to `acc` in this function and return the whole function:\n\n"
             "def sum_squares(values):\n    total = 0\n    for value in values:\n        total += value * value\n"
             "    return total\n\n\ndef mean(values):\n    total = 0\n    for value in values:\n        total += value\n"
             "    return total / len(values)\n")
FREE = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def chat_ids(target: Target, text):
    return torch.tensor([encode_prompt(target.tokenizer, text, chat=True)])  # (1, T)


def verify_ratios(target: Target, *, context: int = 256, ks=range(1, 9), repeats: int = 5) -> dict[int, float]:
    """Cost of a forward over K+1 new tokens on a `context`-token cache, over the cost of one token (the decoder's
    own measurement, serve/core/costs.py)."""
    costs = measure_verify_costs(target.model, sizes=[k + 1 for k in ks], repeats=repeats, context_tokens=context)
    return {k: costs.ratio(k) for k in ks}


def timed(fn):
    t0 = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", default="demo")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--ks", default="1,2,3,4,5,6,7,8")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    target = load_target(args.target)
    load_seconds = time.perf_counter() - t0
    ks = [int(k) for k in args.ks.split(",")]
    n = args.max_new_tokens

    ratios = verify_ratios(target, ks=ks)
    oracle = build_drafter("oracle", target, max_new_tokens=n)
    ids = chat_ids(target, FREE)
    oracle.prepare(ids[0])
    print(f"target={target.name} fp32 threads={args.threads} new_tokens={n} (loaded in {load_seconds:.2f}s)")
    print(f"{'K':>2} {'verify_ratio(K+1)':>18} {'limit':>6} {'speedup':>8} {'of_limit':>8} {'mu':>5}")
    for k in ks:
        plain, t_plain = timed(lambda: plain_generate(target, ids, max_new_tokens=n, eos_token_ids=()))
        spec, t_spec = timed(lambda: speculative_generate(target, oracle, ids, max_new_tokens=n, k=k, eos_token_ids=()))
        plain2, t_plain2 = timed(lambda: plain_generate(target, ids, max_new_tokens=n, eos_token_ids=()))
        assert spec.output_ids == plain.output_ids, "oracle run is not token-identical to plain greedy"
        baseline = (t_plain + t_plain2) / 2
        limit = (k + 1) / ratios[k]
        speedup = baseline / t_spec
        print(f"{k:>2} {ratios[k]:>18.2f} {limit:>6.2f} {speedup:>8.2f} {speedup / limit:>8.2f} {spec.stats.mu:>5.2f}")

    ngram = build_drafter("ngram", target)
    print(f"\nngram drafter, K=5 ({n} new tokens, greedy)")
    print(f"{'prompt':>10} {'mu':>5} {'plain tok/s':>11} {'ngram tok/s':>11} {'speedup':>8}")
    for name, text in (("code-edit", CODE_EDIT), ("free", FREE)):
        ids = chat_ids(target, text)
        speedups, mus, plain_tps, spec_tps = [], [], [], []
        for _ in range(2):
            plain, t_plain = timed(lambda: plain_generate(target, ids, max_new_tokens=n, eos_token_ids=()))
            spec, t_spec = timed(lambda: speculative_generate(target, ngram, ids, max_new_tokens=n, k=5, eos_token_ids=()))
            assert spec.output_ids == plain.output_ids
            speedups.append(t_plain / t_spec)
            mus.append(spec.stats.mu)
            plain_tps.append(n / t_plain)
            spec_tps.append(n / t_spec)
        print(f"{name:>10} {statistics.mean(mus):>5.2f} {statistics.mean(plain_tps):>11.1f} "
              f"{statistics.mean(spec_tps):>11.1f} {statistics.mean(speedups):>8.2f}")


if __name__ == "__main__":
    main()
