"""Self-distillation then a separate capture, against one `data build --capture` pass, side by side.

    .venv/bin/python scripts/bench/capture_while_generating.py [--per-domain 6] [--max-new-tokens 128]
        [--slots 32] [--dtype bfloat16] [--layers eagle3] [--threads 1] [--repeats 2] [--json FILE]

One process, one target, the arms alternating per repeat (each first in turn) over the built-in prompts (greedy): `two passes` (data
build, then data capture of its dataset: what the demo and the README did before) and `one pass` (data build
--capture: the cache from the generating forwards, data/capture_live.py). Reports each arm's build and capture
seconds and the whole, the build's tokens/s, the rows whose answers differ between the arms (in bf16 a row's
rounding moves with the rows beside it, and each row's closing step shifts when the next prompt starts), and, over
the rows both arms answered alike, how far the one-pass cache's states and argmax lie from the separate capture's
(the same tokens read by other kernels: a step of one token a row against a prefill of the whole row).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path


def compare_caches(a: Path, b: Path) -> dict:
    """Over the rows whose tokens both caches hold alike: per stored layer the largest |difference| over the
    layer's largest |state|, and the argmax agreement."""
    import torch

    from draftsmith.data.capture import CacheReader

    ra, rb = CacheReader(a), CacheReader(b)
    worst = {layer: 0.0 for layer in ra.layer_ids}
    same, tokens, rows = 0, 0, 0
    for i in range(len(ra)):
        x, y = ra[i], rb[i]
        if not torch.equal(x["input_ids"], y["input_ids"]):
            continue
        rows += 1
        for layer in ra.layer_ids:
            u, v = x["hidden_states"][layer].float(), y["hidden_states"][layer].float()
            worst[layer] = max(worst[layer], float((u - v).abs().max() / v.abs().max()))
        same += int((x["target_top1"] == y["target_top1"]).sum())
        tokens += x["input_ids"].numel()
    return {"max_relative_difference": {str(k): round(v, 5) for k, v in worst.items()},
            "argmax_agreement": round(same / max(tokens, 1), 5), "rows": rows, "tokens": tokens}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="demo")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--per-domain", type=int, default=6, help="first N built-in prompts per domain")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--slots", type=int, default=32)
    parser.add_argument("--layers", default="eagle3")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    import datasets
    import torch

    from draftsmith.data.build import build_dataset
    from draftsmith.data.capture import capture_hidden_states
    from draftsmith.data.config import CaptureConfig, DataBuildConfig
    from draftsmith.serve.core.target import load_target

    torch.set_num_threads(args.threads)
    target = load_target(args.target, dtype=args.dtype)
    data = DataBuildConfig(per_domain_limit=args.per_domain, max_new_tokens=args.max_new_tokens,
                           batch_size=args.slots)
    data.target.dtype = args.dtype
    capture = CaptureConfig(layers=args.layers)
    quiet = lambda msg: None  # noqa: E731
    figures = {"target": target.name, "dtype": args.dtype, "threads": args.threads, "slots": args.slots,
               "per_domain": args.per_domain, "max_new_tokens": args.max_new_tokens, "layers": args.layers,
               "load_before": os.getloadavg(), "arms": {"two passes": [], "one pass": []}}
    work = Path(tempfile.mkdtemp(prefix="capture-bench-"))
    for repeat in range(args.repeats):
        for name in ("two passes", "one pass")[::1 if repeat % 2 == 0 else -1]:  # each arm first in turn
            folder = work / f"{repeat}-{name.replace(' ', '-')}"
            start = time.perf_counter()
            if name == "two passes":
                built = build_dataset(target, data, out_dir=folder / "data", progress=False, log=quiet)
                middle = time.perf_counter()
                captured = capture_hidden_states(target, folder / "data", folder / "cache", capture, progress=False,
                                                 log=quiet)
                build_seconds, capture_seconds = middle - start, time.perf_counter() - middle
            else:
                built = build_dataset(target, data, out_dir=folder / "data", progress=False, log=quiet,
                                      capture=capture, cache_dir=folder / "cache")
                captured = built.capture
                build_seconds = built.generation_seconds
                capture_seconds = time.perf_counter() - start - build_seconds  # writing parts and the cache
            run = {"seconds": round(time.perf_counter() - start, 1), "build_seconds": round(build_seconds, 1),
                   "capture_seconds": round(capture_seconds, 1),
                   "build_tokens_per_second": round(built.tokens_per_second, 1), "rows": built.rows,
                   "tokens": built.tokens, "tokens_forwarded_by_capture": captured.tokens_captured -
                   captured.tokens_recorded, "load": os.getloadavg()}
            figures["arms"][name].append(run)
            print(f"repeat {repeat} {name}: {json.dumps(run)}", file=sys.stderr, flush=True)
        two, one = (work / f"{repeat}-{n}" for n in ("two-passes", "one-pass"))
        rows = [datasets.load_from_disk(str(f / "data"))["input_ids"] for f in (two, one)]
        figures.setdefault("rows_differing", []).append(sum(a != b for a, b in zip(*rows)))
        figures.setdefault("states", []).append(compare_caches(one / "cache", two / "cache"))
    ratios = [t["seconds"] / o["seconds"] for t, o in zip(figures["arms"]["two passes"], figures["arms"]["one pass"])]
    figures["speedup_per_repeat"] = [round(x, 2) for x in ratios]
    figures["speedup_median"] = round(statistics.median(ratios), 2)
    print(f"two passes / one pass: x{figures['speedup_median']} (per repeat {figures['speedup_per_repeat']}); "
          f"rows differing: {figures['rows_differing']} of {len(rows[0])}; states: {figures['states']}")
    if args.json:
        from draftsmith.eval.report import write_json

        write_json(figures, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
