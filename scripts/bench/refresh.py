"""The served-traffic loop on a real target: serve with --record, refresh the drafter on what was served, and
measure μ on held-out prompts of the same traffic before and after, side by side in one eval run.

    .venv/bin/python scripts/bench/refresh.py --drafter runs/demo/eagle3/drafter \
        --prompts math=../shared/data/eval/gsm8k_test.jsonl --traffic 0:64 --held 1000:1016

1. `draftsmith serve --record OUT/traffic` with the current drafter; --traffic rows of --prompts are sent as chat
   requests (greedy, --max-tokens, --concurrency at a time, filed under the prompts' domain);
2. `draftsmith train` refreshes the drafter from the recorded traffic, starting from its weights
   (model.init_from), with --recipe and --epochs;
3. `draftsmith eval` runs the --held rows (never served, never trained on) with both drafters and plain decoding.
Served tokens/s, refresh wall time and the μ / speedup table are printed; OUT/refresh.json keeps the eval.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from draftsmith.bench.served import running_server

ROOT = Path(__file__).resolve().parents[2]


def _rows(spec: str) -> tuple[str, str]:
    domain, _, path = spec.rpartition("=")
    return domain or "traffic", path


def _slice(rows: list[dict], span: str) -> list[dict]:
    start, _, stop = span.partition(":")
    return rows[int(start):int(stop)]


def _cli(*args: str, threads: int) -> list[str]:
    return [sys.executable, "-m", "draftsmith.cli", *args, f"target.threads={threads}"]


def serve_traffic(args, rows: list[dict], domain: str, record: Path) -> dict:
    """Start the server with --record, send the rows, stop it; served tokens and seconds."""
    with running_server("--target", args.target, "--drafter", args.drafter, "--record", str(record),
                        threads=args.threads) as base:
        model = httpx.get(f"{base}/v1/models", timeout=30).json()["data"][0]["id"]

        def ask(row: dict) -> int:
            text = row.get("question") or row.get("prompt") or row.get("instruction")
            body = {"model": model, "messages": [{"role": "user", "content": text}], "temperature": 0,
                    "max_tokens": args.max_tokens, "metadata": {"domain": domain}}
            reply = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=1800)
            reply.raise_for_status()
            return reply.json()["usage"]["completion_tokens"]

        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool:
            tokens = sum(pool.map(ask, rows))
        return {"requests": len(rows), "tokens": tokens, "seconds": time.perf_counter() - t0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="demo")
    parser.add_argument("--drafter", required=True, help="the drafter folder being served and refreshed")
    parser.add_argument("--prompts", required=True, metavar="[DOMAIN=]JSONL", help="the users' prompts")
    parser.add_argument("--traffic", default="0:64", help="rows served (and then trained on), START:STOP")
    parser.add_argument("--held", default="1000:1016", help="rows measured before and after, START:STOP")
    parser.add_argument("--max-tokens", type=int, default=192)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--recipe", default=str(ROOT / "configs" / "smollm2-135m" / "eagle3.yaml"))
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=str(ROOT / "runs" / "bench_refresh"))
    args = parser.parse_args()

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    domain, path = _rows(args.prompts)
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    traffic, held = _slice(rows, args.traffic), _slice(rows, args.held)
    held_path = out / "held.jsonl"
    held_path.write_text("".join(json.dumps({**r, "domain": domain}) + "\n" for r in held))
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "WANDB_MODE": "offline"}
    os.environ.update(env)

    record = out / "traffic"
    served = json.loads((out / "served.json").read_text()) if (out / "served.json").is_file() else None
    if served is None:
        served = serve_traffic(args, traffic, domain, record)
        (out / "served.json").write_text(json.dumps(served))
    print(f"served {served['requests']} requests, {served['tokens']} tokens in {served['seconds']:.0f}s "
          f"({served['tokens'] / served['seconds']:.1f} tok/s, {args.concurrency} at a time) -> {record}")

    refreshed = out / "refresh"
    t0 = time.perf_counter()
    if not (refreshed / "drafter" / "config.json").is_file():
        subprocess.run(_cli("train", "--config", args.recipe, f"target={args.target}", f"data.dataset={record}",
                            "data.mode=online", f"model.init_from={args.drafter}", f"out_dir={refreshed}",
                            f"optim.epochs={args.epochs}", f"optim.lr={args.lr}", "data.eval_rows=0",
                            "tracking=none", threads=args.threads), cwd=ROOT, check=True, env=env)
    print(f"refresh: {time.perf_counter() - t0:.0f}s")

    result_path = out / "refresh.json"
    subprocess.run(_cli("eval", "--target", args.target, "--prompts", f"{domain}={held_path}",
                        "--drafter", f"before={args.drafter}", "--drafter", f"after={refreshed / 'drafter'}",
                        "--max-new-tokens", str(args.max_tokens), "--no-peers", "--no-cost-model", "--quiet",
                        "--json", str(result_path), threads=args.threads), cwd=ROOT, check=True, env=env)
    result = json.loads(result_path.read_text())
    print(f"\nheld-out {domain} prompts (rows {args.held}, never served or trained on), greedy:")
    print(f"{'drafter':<10}{'mu':>8}{'speedup':>10}")
    for name in ("before", "after"):
        entry = result["overall"][name]
        print(f"{name:<10}{entry['mu']:>8.2f}{entry['speedup']:>9.2f}x")
    print(f"exactness: {result['exactness']['identical']}/{result['exactness']['total']} identical to plain greedy")


if __name__ == "__main__":
    main()
