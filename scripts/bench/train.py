"""Training throughput on the default target: tokens/s per method, the share of an online step spent in the
frozen target, and peak RSS of online against offline training.

    python -m draftsmith.bench.train [--work runs/bench_train] [--per-domain 6] [--steps 12] [--json out.json]

Builds (once, resumable) a small self-distilled dataset from ../shared/data/train/prompts.jsonl and its
hidden-state cache, then runs `draftsmith train` once per (method, mode) in its own process (so peak RSS is
that run's) and reads the numbers back from each run's train_log.jsonl.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from draftsmith.serve.methods.registry import method as method_of

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ROOT.parent / "shared" / "data" / "train" / "prompts.jsonl"
METHODS = ("eagle3", "eagle1", "medusa")


def prepare_data(work: Path, *, per_domain: int, max_new_tokens: int, target_spec: str) -> tuple[Path, Path]:
    from draftsmith.data.build import build_dataset
    from draftsmith.data.capture import capture_hidden_states
    from draftsmith.data.config import CaptureConfig, DataBuildConfig
    from draftsmith.serve.core.target import load_target

    dataset, cache = work / "data", work / "cache"
    model = load_target(target_spec)
    if not (dataset / "dataset_info.json").is_file():
        build_dataset(model, DataBuildConfig(prompts=[str(PROMPTS)], per_domain_limit=per_domain,
                                             max_new_tokens=max_new_tokens, batch_size=8, max_length=1024,
                                             long_prompts="truncate"), out_dir=dataset, progress=False)
    if not (cache / "manifest.json").is_file():
        capture_hidden_states(model, dataset, cache, CaptureConfig(layers="eagle3", storage_dtype="bf16"), progress=False)
    return dataset, cache


def run_one(work: Path, dataset: Path, cache: Path, *, method: str, mode: str, steps: int, target_spec: str,
            extra: list[str]) -> dict:
    out = work / f"{method}-{mode}"
    vocab = ["model.draft_vocab_size=8192"] if method_of(method).own_vocab else []
    cmd = [sys.executable, "-m", "draftsmith", "train", "--config", str(ROOT / f"configs/smollm2-135m/{method}.yaml"),
           f"target={target_spec}", f"data.dataset={dataset}", f"data.cache={cache}", f"data.mode={mode}",
           f"out_dir={out}", f"optim.max_steps={steps}", "optim.batch_size=2", "data.eval_rows=0",
           "data.max_length=512", "tracking=none", "log.every=1", "log.progress=false", "checkpoint.every=0",
           "checkpoint.resume=false", *vocab, *extra]
    if (out / "train_log.jsonl").exists():
        (out / "train_log.jsonl").unlink()
    # one intra-op thread unless told otherwise: on a shared 2-core machine waiting OpenMP threads cost 3-5x
    env = {"OMP_NUM_THREADS": "1", **os.environ, "WANDB_MODE": "offline"}
    subprocess.run(cmd, cwd=ROOT, check=True, env=env)
    records = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    steps_logged = [r for r in records if "loss" in r][1:]  # the first step pays one-off costs
    tokens = sum(r["tokens_per_s"] * r["step_seconds"] for r in steps_logged)
    seconds = sum(r["step_seconds"] for r in steps_logged)
    target_seconds = sum(r["target_share"] * r["step_seconds"] for r in steps_logged)
    cpu_seconds = sum(r["tokens_per_s"] * r["step_seconds"] / r["tokens_per_cpu_s"] for r in steps_logged)
    return {"method": method, "mode": mode, "steps": len(steps_logged) + 1,
            "tokens_per_s": round(tokens / seconds, 1), "tokens_per_cpu_s": round(tokens / cpu_seconds, 1),
            "step_seconds": round(seconds / len(steps_logged), 3),
            "target_share": round(target_seconds / seconds, 3),
            "peak_rss_gib": max(r["peak_rss_gib"] for r in steps_logged)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", default="runs/bench_train")
    parser.add_argument("--target", default="demo")
    parser.add_argument("--per-domain", type=int, default=6, help="prompts per domain in the dataset")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--steps", type=int, default=8, help="optimizer steps per run (batch 2)")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--json", default=None, help="also write the results here")
    parser.add_argument("extra", nargs="*", help="extra key=value overrides for every run")
    args = parser.parse_args(argv)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    dataset, cache = prepare_data(work, per_domain=args.per_domain, max_new_tokens=args.max_new_tokens,
                                  target_spec=args.target)
    results = []
    for method in args.methods.split(","):
        for mode in ("online", "offline"):
            results.append(run_one(work, dataset, cache, method=method, mode=mode, steps=args.steps,
                                   target_spec=args.target, extra=args.extra))
            print(json.dumps(results[-1]), flush=True)
    print("\n| method | mode | tokens/s (wall) | tokens per CPU-second | s/step | share of step in target "
          "| peak RSS (GiB) |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['method']} | {r['mode']} | {r['tokens_per_s']} | {r['tokens_per_cpu_s']} | {r['step_seconds']} "
              f"| {r['target_share']:.0%} | {r['peak_rss_gib']:.2f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
