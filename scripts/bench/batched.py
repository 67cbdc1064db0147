"""The batched decoder at one row against the batch-1 decoder, and self-distillation before and after it ran on the
batched decoder. Every figure is a ratio of runs interleaved in this process.

    python -m draftsmith.bench.batched [--target demo] [--prompts FILE] [--limit 1] [--max-new-tokens 64]
        [--threads 1] [--repeats 2] [--drafters oracle,ngram] [--json out.json]

Per prompt, plain batch-1 decoding (serve.decoding.plain_generate), the batched plain decoder at one slot, and per
drafter the batch-1 speculative decoder and the batched one at one slot run back to back, `--repeats` times; the
sums of seconds are compared with plain batch-1 decoding's, and every output with plain decoding's.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable


def one_row(decoder: Any, prompt: list[int], max_new_tokens: int) -> Any:
    from draftsmith.serve.batch.decoder import Job

    decoder.add(Job(0, prompt, max_new_tokens=max_new_tokens))
    return decoder.run()[0].result


def compare(methods: dict[str, Callable[[list[int]], Any]], prompts: list[list[int]], repeats: int) -> dict:
    """name -> {seconds, speedup over the first method, identical outputs}."""
    for fn in methods.values():  # untimed: lazy initialisation and first shapes
        fn(prompts[0])
    seconds = {name: 0.0 for name in methods}
    outputs: dict[str, list[list[int]]] = {name: [] for name in methods}
    for rep in range(repeats):
        for prompt in prompts:
            for name, fn in methods.items():
                start = time.perf_counter()
                result = fn(prompt)
                seconds[name] += time.perf_counter() - start
                if rep == 0:
                    outputs[name].append(result.output_ids)
    first = next(iter(methods))
    return {name: {"seconds": seconds[name], "speedup": seconds[first] / seconds[name],
                   "identical": sum(a == b for a, b in zip(outputs[name], outputs[first])), "total": len(prompts)}
            for name in methods}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="demo")
    parser.add_argument("--prompts", default="builtin")
    parser.add_argument("--limit", type=int, default=1, help="prompts per domain")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--drafters", default="oracle,ngram")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)

    import torch

    from draftsmith.data.prompts import read_prompts
    from draftsmith.eval.prompts import prepare_prompts
    from draftsmith.serve.batch.decoder import BatchDecoder
    from draftsmith.serve.core.target import load_target
    from draftsmith.serve.decoding import plain_generate, speculative_generate
    from draftsmith.serve.drafters import build_drafter

    torch.set_num_threads(args.threads)
    target = load_target(args.target)
    rows = read_prompts([args.prompts], domain_field="domain", per_domain_limit=args.limit)
    prompts = [p.input_ids for p in prepare_prompts(target.tokenizer, rows)]
    n = args.max_new_tokens
    plain_one = BatchDecoder(target, None, slots=1)
    methods: dict[str, Callable[[list[int]], Any]] = {
        "plain": lambda p: plain_generate(target, torch.tensor([p]), max_new_tokens=n),
        "plain batched, 1 slot": lambda p: one_row(plain_one, p, n)}
    for spec in args.drafters.split(","):
        drafter = build_drafter(spec, target)
        for p in prompts:  # the oracle's answers, computed before timing
            if hasattr(drafter, "prepare"):
                drafter.prepare(torch.tensor(p))
        batched = BatchDecoder(target, drafter, slots=1)
        methods[spec] = lambda p, d=drafter: speculative_generate(target, d, torch.tensor([p]), max_new_tokens=n)
        methods[f"{spec} batched, 1 slot"] = lambda p, b=batched: one_row(b, p, n)
    result = compare(methods, prompts, args.repeats)
    print(f"{len(prompts)} prompts x {n} tokens, {args.repeats} repeats, {args.threads} thread(s); "
          f"speedup over plain batch-1 decoding:")
    for name, r in result.items():
        print(f"  {name:28s} {r['seconds']:7.1f} s  {r['speedup']:.3f}x  identical {r['identical']}/{r['total']}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
