"""`draftsmith data capture`: the target's hidden states at a drafter's layers, as a sharded cache.

Runs alone or under `accelerate launch` / `torchrun` (each process captures its own shards)."""
from __future__ import annotations

import dataclasses
import os
import sys


def add_arguments(parser) -> None:
    parser.add_argument("--target", required=True, help="the target the dataset was built with (folder, .gguf, `demo`)")
    parser.add_argument("--dataset", required=True, help="folder written by `draftsmith data build`")
    parser.add_argument("--out", required=True, help="cache folder; a capture interrupted there resumes")
    parser.add_argument("--layers", default=None,
                        help="eagle3 | eagle1 | medusa | comma-separated layer ids, -1 = final normed state "
                             "(default: capture.layers = eagle3)")
    parser.add_argument("--dtype", default=None, help="storage dtype: bf16 | fp16 | fp32 (default: capture.dtype)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args) -> int:
    from data.capture import capture_hidden_states
    from data.config import CaptureConfig, load_section, validate

    config = load_section(CaptureConfig, "capture", config_file=args.config, overrides=args.overrides)
    changes = {k: v for k, v in (("layers", args.layers), ("dtype", args.dtype)) if v is not None}
    config = dataclasses.replace(config, **changes)
    validate(config)
    result = capture_hidden_states(args.target, args.dataset, args.out, config, progress=not args.no_progress,
                                   log=lambda msg: print(msg, file=sys.stderr))
    if os.environ.get("RANK", "0") == "0":  # one line for the whole launch
        print(result.out_dir)
    return 0
