"""`draftsmith target fetch-demo`: build (once) and print the cached default target folder."""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Optional

from draftsmith.serve.core.demo_target import DEFAULT_MODEL, DEMO_MODELS
from draftsmith.serve.core.errors import ConfigError


@dataclass
class FetchDemoConfig:
    model: str = DEFAULT_MODEL  # one of draftsmith.serve.core.demo_target.DEMO_MODELS
    cache_dir: Optional[str] = None  # default: $DRAFTSMITH_CACHE or ~/.cache/draftsmith
    verify: bool = False  # also check every file's sha256

    def validate(self) -> None:
        if self.model not in DEMO_MODELS:
            raise ConfigError(f"model={self.model!r}: choose one of {', '.join(sorted(DEMO_MODELS))}")


def add_arguments(parser) -> None:
    parser.add_argument("--model", default=None, choices=sorted(DEMO_MODELS), help=f"default {DEFAULT_MODEL}")
    parser.add_argument("--cache-dir", default=None, help="default: $DRAFTSMITH_CACHE or ~/.cache/draftsmith")
    parser.add_argument("--verify", action="store_true", default=None, help="also check every file's sha256")


def run(args) -> int:
    from draftsmith.serve.core.config import load_config
    from draftsmith.serve.core.demo_target import fetch_demo

    config = load_config(FetchDemoConfig, config_file=args.config, section="fetch_demo", overrides=args.overrides,
                         flags={"model": args.model, "cache_dir": args.cache_dir, "verify": args.verify})
    path = fetch_demo(config.model, cache_dir=config.cache_dir, verify=config.verify,
                      log=lambda msg: print(msg, file=sys.stderr))
    print(path)
    return 0
