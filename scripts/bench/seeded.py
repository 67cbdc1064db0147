"""Seeded sampling under speculation: does one seed give one text, alone, in a batch, with every drafter?

Per drafter (plain decoding too), N seeded requests at temperature 0.7 run alone (batch 1) and together in one
batch of N (continuous batching, mixed prompts and lengths), and are compared with plain seeded decoding alone:
the table counts the seeds whose texts are all the same. Then each drafter's μ seeded (position-keyed noise,
serve/core/noise.py) and unseeded (the rejection sampler) on the same prompts: what keying the noise costs.

    python -m draftsmith.bench.seeded --prompts runs/demo/prompts_eval.jsonl --drafter ngram \\
        --drafter hybrid=hybrid:runs/demo/eagle3/drafter --drafter eagle3=runs/demo/eagle3/drafter --threads 1
"""
from __future__ import annotations

import argparse
import json

import torch

from draftsmith.data.prompts import read_prompts
from draftsmith.eval.drafters import build_entries
from draftsmith.eval.prompts import prepare_prompts
from draftsmith.serve.batch.decoder import BatchDecoder, Job
from draftsmith.serve.core.target import load_target
from draftsmith.serve.decoding import plain_generate, speculative_generate
from draftsmith.serve.drafters.spec import parse_named_specs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="demo")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--prompts", default="builtin")
    parser.add_argument("--requests", type=int, default=8, help="seeded requests (one prompt and seed each)")
    parser.add_argument("--drafter", action="append", default=[], metavar="[NAME=]SPEC")
    parser.add_argument("--k", type=int, default=None)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", default=None, metavar="OUT.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target = load_target(args.target, dtype=args.dtype)
    prepared = prepare_prompts(target.tokenizer, read_prompts([args.prompts]))
    # spread over the domains: every len/N-th prompt
    prompts = [torch.tensor([p.input_ids]) for p in prepared[:: max(1, len(prepared) // args.requests)]][: args.requests]
    entries = build_entries(target, parse_named_specs(args.drafter or ["ngram"]), max_new_tokens=args.max_new_tokens)
    seeds = [1003 + i for i in range(len(prompts))]
    settings = dict(temperature=args.temperature, max_new_tokens=args.max_new_tokens)

    reference = [plain_generate(target, p, seed=s, **settings).output_ids for p, s in zip(prompts, seeds)]
    rows = {}
    for name, drafter in [("plain", None)] + [(e.name, e.drafter) for e in entries]:
        alone, mu_seeded, mu_free = [], [], []
        for p, s in zip(prompts, seeds):
            if drafter is None:
                alone.append(plain_generate(target, p, seed=s, **settings).output_ids)
                continue
            res = speculative_generate(target, drafter, p, k=args.k, seed=s, **settings)
            alone.append(res.output_ids)
            mu_seeded.append(res.stats.mu)
            torch.manual_seed(s)
            mu_free.append(speculative_generate(target, drafter, p, k=args.k, **settings).stats.mu)
        decoder = BatchDecoder(target, drafter, slots=len(prompts), k=args.k)
        for i, (p, s) in enumerate(zip(prompts, seeds)):
            decoder.add(Job(i, p[0].tolist(), max_new_tokens=args.max_new_tokens,
                            temperature=args.temperature, seed=s))
        together = [f.result.output_ids for f in decoder.run()]
        same = [a == b == r for a, b, r in zip(alone, together, reference)]
        rows[name] = {"one_text": sum(same), "seeds": len(seeds),
                      "alone_equals_plain": sum(a == r for a, r in zip(alone, reference)),
                      "batch_equals_plain": sum(b == r for b, r in zip(together, reference))}
        if mu_seeded:
            rows[name].update(mu_seeded=sum(mu_seeded) / len(mu_seeded), mu_unseeded=sum(mu_free) / len(mu_free))
        print(f"{name}: {rows[name]}", flush=True)

    print(f"\n{target.name} {args.dtype}, {len(seeds)} seeds, temperature {args.temperature}, "
          f"{args.max_new_tokens} tokens, {args.threads} thread(s)")
    print(f"{'method':<12} {'one text':>9} {'alone=plain':>12} {'batch=plain':>12} {'μ seeded':>9} {'μ unseeded':>11}")
    for name, r in rows.items():
        mus = f"{r['mu_seeded']:>9.2f} {r['mu_unseeded']:>11.2f}" if "mu_seeded" in r else f"{'':>9} {'':>11}"
        print(f"{name:<12} {r['one_text']:>5}/{r['seeds']:<3} {r['alone_equals_plain']:>12} "
              f"{r['batch_equals_plain']:>12} {mus}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"target": target.name, "dtype": args.dtype, "temperature": args.temperature,
                       "max_new_tokens": args.max_new_tokens, "threads": args.threads, "methods": rows}, f, indent=2)


if __name__ == "__main__":
    main()
