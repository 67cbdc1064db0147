"""`data build --server` against the in-process build on the same prompts, one run: tokens/s of each and
whether their rows are token-identical (greedy).

    .venv/bin/python scripts/bench/endpoint.py [--prompts builtin] [--per-domain 2] [--max-new-tokens 64]

The server is `draftsmith serve --no-speculation` on the same target and thread count, started before the
clock runs; the endpoint build loads only the target's tokenizer and config. Both builds decode --batch-size
rows at a time (the server: as many requests in flight, batched by its engine).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from draftsmith.bench.served import ROOT, running_server


def build(args, out: Path, *extra: str) -> dict:
    """Run `data build` into a fresh folder; its wall time and the generation figures it records."""
    cmd = [sys.executable, "-m", "draftsmith.cli", "data", "build", "--target", args.target, "--out", str(out),
           "--no-progress", f"data.per_domain_limit={args.per_domain}", f"data.max_new_tokens={args.max_new_tokens}",
           f"data.batch_size={args.batch_size}", f"data.server.concurrency={args.batch_size}",
           f"target.threads={args.threads}", *extra]
    for source in args.prompts:
        cmd += ["--prompts", source]
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, check=True)
    info = json.loads((out / "build_info.json").read_text())
    return {"wall": time.perf_counter() - t0, **info["generation"]}


def rows(folder: Path) -> dict[str, list[int]]:
    import datasets

    data = datasets.load_from_disk(str(folder))
    return {row["id"]: list(row["input_ids"]) for row in data}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="demo")
    parser.add_argument("--prompts", action="append", default=None, help="prompt sources (default: builtin)")
    parser.add_argument("--per-domain", type=int, default=2, help="prompts per domain")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=8, help="rows decoding together / requests in flight")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=str(ROOT / "runs" / "bench_endpoint"))
    args = parser.parse_args()
    args.prompts = args.prompts or ["builtin"]
    out = Path(args.out)
    subprocess.run(["rm", "-rf", str(out)], check=True)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)

    with running_server("--target", args.target, "--no-speculation", threads=args.threads) as url:
        server = build(args, out / "server", "--server", url)
    local = build(args, out / "in-process")
    same = rows(out / "server") == rows(out / "in-process")
    print(f"\n{'build':<12}{'tokens':>8}{'gen s':>8}{'tok/s':>8}{'wall s':>8}")
    for name, fig in (("in-process", local), ("--server", server)):
        print(f"{name:<12}{fig['tokens']:>8}{fig['seconds']:>8.1f}{fig['tokens_per_second']:>8.1f}{fig['wall']:>8.1f}")
    print(f"endpoint / in-process tok/s: {server['tokens_per_second'] / local['tokens_per_second']:.2f}x; "
          f"rows token-identical: {same}")


if __name__ == "__main__":
    main()
