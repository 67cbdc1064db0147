"""Figures of the data pipeline on the default target.

    .venv/bin/python scripts/bench/data.py [--out runs/bench_data] [--per-domain 8] [--max-new-tokens 32]

- self-distillation tokens/s of the whole build at --batch-size, and against batch 1 on the same prompts
  (the first --batch1-per-domain of each domain) in one process, alternating, best of --repeats;
- capture throughput against a plain forward (the full causal LM, logits included) of the same batches in
  the same process, alternating, best of --repeats; a decoder-only forward (no lm_head) is shown too;
- cache bytes per token for each drafter kind and dtype, measured on a small capture and by formula;
- peak RSS of build and of capture, each measured in its own process.

Each stage runs in a child process of this script (`--stage NAME`), so its peak RSS is its own.
Prompts: the shared training prompts, the first --per-domain rows of each domain.
--out must be new, empty, or this script's own earlier output (its marker file says so): only what the script
wrote there is removed before a run.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

from draftsmith.serve.core.target_config import TargetConfig
from draftsmith.serve.methods import registry

ROOT = Path(__file__).resolve().parents[2]
SHARED_PROMPTS = ROOT.parent / "shared" / "data" / "train" / "prompts.jsonl"
MARKER = ".draftsmith-bench-data"  # written first into --out: the folder is this script's own
# what the stages and the report write in --out (each stage must do its work, not resume an earlier run's)
OWN = ("data", "data-small", "data-b*-*", "cache-*", "bench_data.json", MARKER)
DTYPES = ("bf16", "fp16", "fp32")


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def _quiet(_msg: str) -> None:
    pass


def _load(args):
    import torch

    from draftsmith.serve.core.target import load_target

    if args.threads:
        torch.set_num_threads(args.threads)
    return load_target(args.target)


def stage_build(args, *, batch_size: int, per_domain: int, name: str) -> dict:
    from draftsmith.data.build import build_dataset
    from draftsmith.data.config import DataBuildConfig

    target = _load(args)
    config = DataBuildConfig(prompts=[str(args.prompts)], per_domain_limit=per_domain, batch_size=batch_size,
                             max_new_tokens=args.max_new_tokens, temperature=0.0,
                             target=TargetConfig(device="cpu"))
    start = time.perf_counter()
    result = build_dataset(target, config, out_dir=Path(args.out) / name, progress=False, log=_quiet)
    return {"batch_size": batch_size, "prompts": result.counts["prompts"], "rows": result.rows,
            "tokens": result.tokens, "generated_tokens": result.generated_tokens,
            "generation_seconds": round(result.generation_seconds, 2),
            "tokens_per_second": round(result.tokens_per_second, 2), "wall_seconds": round(time.perf_counter() - start, 2),
            "reused_rows": result.reused_rows, "peak_rss_mib": round(peak_rss_mib(), 1)}


def stage_batch_vs_1(args) -> dict:
    """Builds of the same prompts at batch 1 and at --batch-size, alternating in one process."""
    from draftsmith.data.build import build_dataset
    from draftsmith.data.config import DataBuildConfig

    target = _load(args)
    best: dict[int, dict] = {}
    for r in range(args.repeats):
        for batch_size in (1, args.batch_size):
            config = DataBuildConfig(prompts=[str(args.prompts)], per_domain_limit=args.batch1_per_domain,
                                     batch_size=batch_size, max_new_tokens=args.max_new_tokens,
                                     target=TargetConfig(device="cpu"))
            result = build_dataset(target, config, out_dir=Path(args.out) / f"data-b{batch_size}-{r}",
                                   progress=False, log=_quiet)
            run = {"prompts": result.counts["prompts"], "generated_tokens": result.generated_tokens,
                   "seconds": round(result.generation_seconds, 2), "tokens_per_second": round(result.tokens_per_second, 2)}
            if batch_size not in best or run["tokens_per_second"] > best[batch_size]["tokens_per_second"]:
                best[batch_size] = run
    return {"batch_1": best[1], f"batch_{args.batch_size}": best[args.batch_size],
            "speedup": round(best[args.batch_size]["tokens_per_second"] / best[1]["tokens_per_second"], 2)}


def stage_capture(args) -> dict:
    """The capture alone (eagle3, bf16): its throughput and its peak RSS."""
    from draftsmith.data.capture import capture_hidden_states
    from draftsmith.data.config import CaptureConfig

    target = _load(args)
    config = CaptureConfig(layers="eagle3", storage_dtype="bf16", batch_tokens=args.batch_tokens,
                           target=TargetConfig(device="cpu"))
    result = capture_hidden_states(target, Path(args.out) / "data", Path(args.out) / "cache-rss", config,
                                   progress=False, log=_quiet)
    return {"tokens": result.tokens, "seconds": round(result.seconds, 2),
            "tokens_per_second": round(result.tokens_per_second, 1), "bytes": result.bytes,
            "shards_written": result.shards_written, "peak_rss_mib": round(peak_rss_mib(), 1)}


def stage_capture_vs_forward(args) -> dict:
    """Capture and plain forwards of the same batches, alternating in one process; best of --repeats."""
    import datasets
    import torch

    from draftsmith.data.capture import capture_hidden_states, plan_batches, right_pad
    from draftsmith.data.config import CaptureConfig

    target = _load(args)
    data_dir = Path(args.out) / "data"
    dataset = datasets.load_from_disk(str(data_dir))
    config = CaptureConfig(layers="eagle3", storage_dtype="bf16", batch_tokens=args.batch_tokens,
                           target=TargetConfig(device="cpu"))
    sequences = [list(x) for x in dataset["input_ids"]]
    shards = [range(s, min(s + config.rows_per_shard, len(sequences)))
              for s in range(0, len(sequences), config.rows_per_shard)]
    batches = [[sequences[shard[i]] for i in batch] for shard in shards
               for batch in plan_batches([len(sequences[j]) for j in shard], config.batch_tokens)]
    tokens = sum(map(len, sequences))
    pad = target.tokenizer.pad_token_id or 0

    @torch.inference_mode()
    def forward(module) -> float:
        start = time.perf_counter()
        for batch in batches:
            input_ids, attention_mask = right_pad(batch, pad)
            module(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        return time.perf_counter() - start

    timings: dict[str, list[float]] = {"plain_forward": [], "decoder_forward": [], "capture": []}
    forward(target.model)  # warm-up
    for r in range(args.repeats):
        timings["plain_forward"].append(forward(target.model))
        timings["decoder_forward"].append(forward(target.model.get_decoder()))
        cache = Path(args.out) / f"cache-speed-{r}"
        shutil.rmtree(cache, ignore_errors=True)  # a finished cache would be reused, not captured
        start = time.perf_counter()
        capture_hidden_states(target, data_dir, cache, config, progress=False, log=_quiet)
        timings["capture"].append(time.perf_counter() - start)  # includes dataset hashing and checks
    best = {k: min(v) for k, v in timings.items()}
    return {"tokens": tokens, "batches": len(batches), "batch_tokens": config.batch_tokens,
            "seconds": {k: [round(x, 2) for x in v] for k, v in timings.items()},
            "tokens_per_second": {k: round(tokens / v, 1) for k, v in best.items()},
            "capture_over_plain_forward": round(best["plain_forward"] / best["capture"], 3),
            "capture_over_decoder_forward": round(best["decoder_forward"] / best["capture"], 3)}


def stage_sizes(args) -> dict:
    """Bytes per token for each drafter kind and dtype: a small capture of each, and the formula."""
    import datasets

    from draftsmith.data.cache import bytes_per_token
    from draftsmith.data.capture import capture_hidden_states
    from draftsmith.data.config import CaptureConfig
    from draftsmith.data.layers import resolve_layers
    from draftsmith.serve.core.target import text_config

    target = _load(args)
    small = Path(args.out) / "data-small"
    if not small.is_dir():
        datasets.load_from_disk(str(Path(args.out) / "data")).select(range(4)).save_to_disk(str(small))
    hidden = text_config(target.config).hidden_size
    sizes = {}
    for kind in registry.names(trained=True):  # each trained method's layer set
        stored = resolve_layers(kind, target.num_layers).stored
        for dtype in DTYPES:
            config = CaptureConfig(layers=kind, storage_dtype=dtype, batch_tokens=args.batch_tokens,
                                   target=TargetConfig(device="cpu"))
            result = capture_hidden_states(target, small, Path(args.out) / f"cache-{kind}-{dtype}", config,
                                           progress=False, log=_quiet)
            per_token = bytes_per_token(len(stored), hidden, dtype)
            sizes[f"{kind}/{dtype}"] = {"stored_layers": list(stored), "bytes_per_token_formula": per_token,
                                        "bytes_per_token_measured": round(result.bytes / result.tokens, 1),
                                        "gib_per_million_tokens": round(per_token * 1e6 / (1 << 30), 2)}
    return sizes


STAGES = ("build", "batch_vs_1", "capture", "capture_vs_forward", "sizes")


def run_stage(args) -> dict:
    if args.stage == "build":
        return stage_build(args, batch_size=args.batch_size, per_domain=args.per_domain, name="data")
    return {"batch_vs_1": stage_batch_vs_1, "capture": stage_capture, "capture_vs_forward": stage_capture_vs_forward, "sizes": stage_sizes}[args.stage](args)


def prepare_out(out: Path) -> Path:
    """`out`, emptied of what an earlier run of this script wrote there; SystemExit for a folder it did not make."""
    if out.exists() and not out.is_dir():
        raise SystemExit(f"--out {out} is a file, not a folder: choose another path")
    if out.is_dir() and any(out.iterdir()) and not (out / MARKER).is_file():
        names = sorted(p.name for p in out.iterdir())
        raise SystemExit(f"--out {out} already holds {names[:6]}{' ...' if len(names) > 6 else ''}, not an output "
                         f"of this benchmark: choose a new or empty folder (nothing was removed)")
    for pattern in OWN:
        for path in out.glob(pattern):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).write_text("scripts/bench/data.py writes this folder; a rerun removes what it wrote here\n")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="demo")
    parser.add_argument("--prompts", default=str(SHARED_PROMPTS))
    parser.add_argument("--out", default=str(ROOT / "runs" / "bench_data"))
    parser.add_argument("--per-domain", type=int, default=8, help="prompts per domain for the batched build")
    parser.add_argument("--batch1-per-domain", type=int, default=2, help="prompts per domain for batch 1 vs batched")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--batch-tokens", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--stage", choices=STAGES, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.stage:
        print(json.dumps(run_stage(args)))
        return 0
    out = prepare_out(Path(args.out))
    figures: dict = {"target": args.target, "prompts": args.prompts, "max_new_tokens": args.max_new_tokens}
    forwarded = [a for a in sys.argv[1:]]
    for stage in STAGES:
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, __file__, *forwarded, "--stage", stage], cwd=ROOT,
                              capture_output=True, text=True)
        if proc.returncode != 0:
            print(proc.stderr[-4000:], file=sys.stderr)
            raise SystemExit(f"stage {stage} failed")
        figures[stage] = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"[{stage}] {time.perf_counter() - start:.0f} s: {json.dumps(figures[stage])}", file=sys.stderr)
    (out / "bench_data.json").write_text(json.dumps(figures, indent=1))
    print(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
