"""`draftsmith target fetch-demo`: build (once) and print the cached default target folder."""
from __future__ import annotations

import sys


def add_arguments(parser) -> None:
    from serve.demo_target import DEFAULT_MODEL, DEMO_MODELS

    parser.add_argument("--model", default=DEFAULT_MODEL, choices=sorted(DEMO_MODELS))
    parser.add_argument("--cache-dir", default=None, help="default: $DRAFTSMITH_CACHE or ~/.cache/draftsmith")
    parser.add_argument("--verify", action="store_true", help="also check every file's sha256")


def run(args) -> int:
    from serve.demo_target import fetch_demo

    path = fetch_demo(args.model, cache_dir=args.cache_dir, verify=args.verify,
                      log=lambda msg: print(msg, file=sys.stderr))
    print(path)
    return 0
