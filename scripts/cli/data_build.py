"""`draftsmith data build`: prompts -> the target's own answers -> tokenized dataset with loss masks."""
from __future__ import annotations

import sys

from draftsmith.serve.core.threads import THREADS_HELP


def add_arguments(parser) -> None:
    parser.add_argument("--target", required=True, help="HF folder, .gguf file, hub id, or `demo` (= data.target.spec)")
    parser.add_argument("--prompts", action="append", default=None, metavar="SRC",
                        help="JSONL file (DOMAIN=file sets its rows' domain), HF datasets folder/name, builtin or "
                             "builtin:<domain>; repeatable (default: data.prompts of the recipe)")
    parser.add_argument("--out", required=True, help="dataset folder (datasets.load_from_disk); resumable")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace a dataset in --out whose answered rows no earlier build kept (its .work); "
                             "without it such a folder is refused before any work")
    parser.add_argument("--limit", type=int, default=None, help="first N prompts of each source (= data.limit)")
    parser.add_argument("--domain-field", default=None, help="row field naming the domain (default: domain)")
    parser.add_argument("--server", default=None, metavar="URL",
                        help="generate through this OpenAI-compatible server (vLLM, SGLang, draftsmith serve) "
                             "instead of in process (= data.server.url; see data.server.* for the rest)")
    parser.add_argument("--traffic", action="append", default=None, metavar="DIR",
                        help="a `serve --record` folder: its served answers join the dataset as they are; "
                             "repeatable (= data.traffic)")
    parser.add_argument("--capture", default=None, metavar="DIR",
                        help="also write the hidden-state cache of offline training to DIR, from the forwards that "
                             "generate the answers (no `data capture` pass; settings: capture.* and the two flags "
                             "below, as `data capture` takes them)")
    parser.add_argument("--layers", default=None,
                        help="with --capture: a method's layer set (eagle3, eagle1, medusa, ...) or layer ids "
                             "(default: capture.layers = eagle3)")
    parser.add_argument("--storage-dtype", default=None,
                        help="with --capture: the cache's dtype, bf16 | fp16 | fp32 (default: capture.storage_dtype "
                             "= bf16)")
    parser.add_argument("--threads", type=int, default=None, help=THREADS_HELP)
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args) -> int:
    from draftsmith.data.build import build_dataset
    from draftsmith.data.config import CaptureConfig, DataBuildConfig
    from draftsmith.serve.core.config import load_config
    from draftsmith.serve.core.errors import ConfigError
    from draftsmith.serve.core.files import check_output_path

    flags = {"target.spec": args.target, "target.threads": args.threads, "prompts": args.prompts, "limit": args.limit,
             "domain_field": args.domain_field, "traffic": args.traffic, "server.url": args.server}
    overrides = [o for o in args.overrides or [] if not o.startswith("capture.")]
    config = load_config(DataBuildConfig, config_file=args.config, section="data", overrides=overrides,
                         flags=flags)
    capture = None
    if args.capture:  # the recipe's `capture` section and capture.* overrides, as `data capture` reads them
        capture = load_config(CaptureConfig, config_file=args.config, section="capture",
                              overrides=[o for o in args.overrides or [] if o.startswith("capture.")],
                              flags={"layers": args.layers, "storage_dtype": args.storage_dtype})
        check_output_path(args.capture, what="cache folder", folder=True)
    elif args.layers or args.storage_dtype or any(o.startswith("capture.") for o in args.overrides or []):
        raise ConfigError("--layers, --storage-dtype and capture.* set the cache of --capture DIR: add --capture, "
                          "or capture later with `draftsmith data capture`")
    check_output_path(args.out, what="dataset folder", folder=True)
    config.target.apply_threads()
    result = build_dataset(config.target.spec, config, out_dir=args.out, progress=not args.no_progress,
                           log=lambda msg: print(msg, file=sys.stderr), overwrite=args.overwrite,
                           capture=capture, cache_dir=args.capture)
    if result.draft_vocab_coverage is not None:
        print(f"a draft vocabulary of {config.draft_vocab_size} tokens would cover {result.draft_vocab_coverage:.2%} "
              f"of the loss tokens (training picks its own: model.draft_vocab_size)", file=sys.stderr)
    print(result.out_dir)
    return 0
