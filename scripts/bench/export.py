"""Export + validation time per format, and μ read back against the native drafter, on the default target.

    python -m draftsmith.bench.export --drafters runs/smollm2-135m/eagle3/drafter runs/.../medusa/drafter
    python -m draftsmith.bench.export --train-steps 40        # no trained drafters yet: train tiny ones first

With --train-steps, EAGLE-1, EAGLE-3 and Medusa drafters are trained for a few steps on the target's own
greedy answers to a few prompts of ../shared/data/train/prompts.jsonl (a toy run: the point is the export,
not the drafter). Every (drafter, format) pair the engines support is exported, validated and read back;
results go to OUT/results.json and a Markdown table on stdout.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from draftsmith.serve.methods.registry import method as method_of, names

if TYPE_CHECKING:  # annotations only: the target's module imports torch
    from draftsmith.serve.core.target import Target

PROMPTS_FILE = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "train" / "prompts.jsonl"


def distilled_rows(target: Target, *, count: int, new_tokens: int, prompts_file: Path) -> list[dict]:
    """`count` prompts (round-robin over domains) + the target's greedy answer; loss on the answer only.
    new_tokens=0: the prompts alone, loss on every token (the objective is the target's own distribution)."""
    import torch

    from draftsmith.serve.core.prompts import encode_prompt

    by_domain: dict[str, list[str]] = {}
    with open(prompts_file) as f:
        for line in f:
            row = json.loads(line)
            by_domain.setdefault(row.get("domain", "default"), []).append(row["prompt"])
    texts = []
    while len(texts) < count and any(by_domain.values()):
        for rows in by_domain.values():
            if rows and len(texts) < count and len(rows[0]) < 400:
                texts.append(rows.pop(0))
            elif rows:
                rows.pop(0)
    tok = target.tokenizer
    encoded = [encode_prompt(tok, t, chat=True) for t in texts]
    out = []
    for i, ids in enumerate(encoded):
        if new_tokens == 0:  # no generation (slow on a busy CPU): learn the target's distribution on the prompts
            out.append({"id": f"bench{i}", "domain": "bench", "input_ids": list(ids), "loss_mask": [1] * len(ids)})
            continue
        prompt = torch.tensor([list(ids)])
        answer = target.model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens,
                                       do_sample=False, pad_token_id=tok.pad_token_id)[0, prompt.shape[1]:]
        full = list(ids) + answer.tolist()
        out.append({"id": f"bench{i}", "domain": "bench", "input_ids": full,
                    "loss_mask": [0] * len(ids) + [1] * answer.numel()})
    return out


def train_quick(target_spec: str, target: Target, out: Path, *, steps: int, rows: int, new_tokens: int) -> dict[str, Path]:
    from datasets import Dataset

    from draftsmith.serve.core.config import load_config
    from draftsmith.train.config import TrainConfig, check
    from draftsmith.train.run import train_drafter

    data_dir = out / "data"
    if not data_dir.exists():
        table = distilled_rows(target, count=rows, new_tokens=new_tokens, prompts_file=PROMPTS_FILE)
        Dataset.from_dict({k: [r[k] for r in table] for k in ("id", "domain", "input_ids", "loss_mask")}
                          ).save_to_disk(str(data_dir))
    recipes = {name: ["model.num_speculative_tokens=3", "model.ttt_steps=3",
                      *(["model.draft_vocab_size=2048"] if method_of(name).own_vocab else [])]
               for name in names(trained=True) if method_of(name).exports}
    drafters = {}
    for method, extra in recipes.items():
        run_dir = out / "train" / method
        if not (run_dir / "drafter" / "config.json").is_file():
            config = check(load_config(TrainConfig, overrides=[
                f"target={target_spec}", f"out_dir={run_dir}", f"model.method={method}", *extra,
                f"data.dataset={data_dir}", "data.max_length=384", "data.eval_rows=2", "optim.lr=1e-3",
                "optim.batch_size=2", f"optim.max_steps={steps}", "optim.warmup_steps=2", "tracking=none",
                "log.progress=false", "log.every=10", "checkpoint.every=0", "device=cpu"]))
            t0 = time.perf_counter()
            train_drafter(config)
            print(f"trained {method} in {time.perf_counter() - t0:.0f}s", flush=True)
        drafters[method] = run_dir / "drafter"
    return drafters


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="demo")
    parser.add_argument("--drafters", nargs="*", default=[], help="native drafter folders to export")
    parser.add_argument("--train-steps", type=int, default=0, help="train tiny drafters first (0 = use --drafters)")
    parser.add_argument("--train-rows", type=int, default=16)
    parser.add_argument("--train-answer-tokens", type=int, default=32,
                        help="greedy answer tokens per training prompt; 0 = train on the prompts alone")
    parser.add_argument("--out", default="runs/bench_export")
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    args = parser.parse_args(argv)
    os.environ.setdefault("WANDB_MODE", "offline")

    import torch

    from draftsmith.serve.drafters.folder import read_config
    from draftsmith.serve.core.errors import DraftsmithError
    from draftsmith.serve.export import export_drafter
    from draftsmith.serve.export.common import default_prompts
    from draftsmith.serve.core.target import load_target

    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.out)
    target = load_target(args.target)
    drafters = [Path(d) for d in args.drafters]
    if args.train_steps:
        drafters += list(train_quick(args.target, target, out, steps=args.train_steps, rows=args.train_rows,
                                     new_tokens=args.train_answer_tokens).values())
    if not drafters:
        parser.error("give --drafters DIR... or --train-steps N")
    prompts = default_prompts(target, count=args.prompts)
    results = []
    for drafter in drafters:
        method = read_config(drafter).method
        for fmt in method_of(method).exports:
            row = {"drafter": str(drafter), "method": method, "format": fmt}
            try:
                # overwrite: a rerun replaces this benchmark's own earlier export of the pair
                report = export_drafter(drafter, fmt, out / "exports" / f"{drafter.parent.name}-{method}-{fmt}",
                                        target=target, target_spec=args.target, prompts=prompts,
                                        max_new_tokens=args.max_new_tokens, overwrite=True)
                row.update({k: getattr(report, k) for k in ("export_seconds", "validate_seconds", "mu_native",
                                                            "mu_readback", "cycles", "proposals_compared", "k",
                                                            "layer_ids", "speculators_package")})
            except DraftsmithError as err:
                row["error"] = str(err)
            results.append(row)
            print(json.dumps(row), flush=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"target": target.name, "torch_threads": torch.get_num_threads(),
                                                  "prompts": args.prompts, "max_new_tokens": args.max_new_tokens,
                                                  "results": results}, indent=2))
    print("\n| method | format | export s | validation s | μ native | μ read back | cycles |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for r in results:
        if "error" in r:
            print(f"| {r['method']} | {r['format']} | error: {r['error'][:80]} | | | | |")
        else:
            print(f"| {r['method']} | {r['format']} | {r['export_seconds']:.2f} | {r['validate_seconds']:.1f} | "
                  f"{r['mu_native']:.3f} | {r['mu_readback']:.3f} | {r['cycles']} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
