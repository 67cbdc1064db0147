"""`draftsmith data capture`: the target's hidden states at a drafter's layers, as a sharded cache.

Runs alone or under `accelerate launch` / `torchrun` (each process captures its own shards)."""
from __future__ import annotations

import sys

from draftsmith.cli.plan_flags import add_plan_arguments
from draftsmith.serve.core.process_group import launch
from draftsmith.serve.core.threads import THREADS_HELP


def add_arguments(parser) -> None:
    parser.add_argument("--target", default=None,
                        help="the target the dataset was built with (folder, .gguf, `demo`; = capture.target.spec)")
    parser.add_argument("--dataset", default=None, help="folder written by `draftsmith data build`")
    parser.add_argument("--out", default=None, help="cache folder; a capture interrupted there resumes")
    parser.add_argument("--layers", default=None,
                        help="eagle3 | eagle1 | medusa | comma-separated layer ids, -1 = final normed state "
                             "(default: capture.layers = eagle3)")
    parser.add_argument("--storage-dtype", "--dtype", dest="storage_dtype", default=None,
                        help="the cache's dtype: bf16 | fp16 | fp32 (default: capture.storage_dtype = bf16; "
                             "--dtype is its earlier name)")
    parser.add_argument("--allow-other-target", action="store_true", default=None,
                        help="capture a dataset built for another target of the same tokenizer and hidden size (a "
                             "fine-tune of it); without it such a dataset is refused, naming both targets "
                             "(= capture.allow_other_target)")
    parser.add_argument("--threads", type=int, default=None, help=THREADS_HELP)
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_plan_arguments(parser)


def run(args) -> int:
    from draftsmith.data.capture import capture_hidden_states
    from draftsmith.data.config import CaptureConfig
    from draftsmith.serve.core.config import load_config
    from draftsmith.serve.core.errors import ConfigError
    from draftsmith.serve.core.files import check_output_path

    flags = {"target.spec": args.target, "target.threads": args.threads, "layers": args.layers,
             "storage_dtype": args.storage_dtype, "allow_other_target": args.allow_other_target}
    config = load_config(CaptureConfig, config_file=args.config, section="capture", overrides=args.overrides,
                         flags=flags)
    if args.plan:
        from draftsmith.data.capture_plan import capture_plan
        from draftsmith.cli.plan_flags import plan_setting, report

        devices, per_node, memory = plan_setting(args)
        _, table, error = capture_plan(config, devices=devices, per_node=per_node, device_gib=memory)
        return report(table, error)
    missing = [flag for flag, value in (("--target", args.target), ("--dataset", args.dataset), ("--out", args.out))
               if not value]
    if missing:
        raise ConfigError(f"data capture needs {', '.join(missing)} (only --plan runs without them)")
    check_output_path(args.out, what="cache folder", folder=True)
    config.target.apply_threads()  # each process of a multi-process capture then takes its share
    result = capture_hidden_states(config.target.spec, args.dataset, args.out, config, progress=not args.no_progress,
                                   log=lambda msg: print(msg, file=sys.stderr))
    if launch().is_main:  # one line for the whole launch
        print(result.out_dir)
    return 0
