"""`draftsmith` command line: parse, then call one library function.

Each subcommand lives in its own module `scripts/cmd_<name>.py` exposing
`add_arguments(parser)` and `run(args) -> int`. A subcommand whose module is absent is listed
but says plainly that it is not built yet and exits non-zero.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

# (command path, module, help, issue that builds it)
COMMANDS = [
    (("target", "fetch-demo"), "scripts.cmd_fetch_demo", "build the embedded default target into a cached HF folder, print its path", 2),
    (("data", "build"), "scripts.cmd_data_build", "prompts -> conversations -> self-distilled responses -> tokenized dataset", 4),
    (("data", "capture"), "scripts.cmd_data_capture", "hidden-state cache for offline training (distributed, resumable)", 4),
    (("train",), "scripts.cmd_train", "train a drafter (alone or under accelerate launch / torchrun)", 5),
    (("eval",), "scripts.cmd_eval", "mu per domain and speed side by side; --json and --report DIR", 6),
    (("generate",), "scripts.cmd_generate", "live speculative generation of one prompt with per-cycle stats", 3),
    (("serve",), "scripts.cmd_serve", "OpenAI-compatible HTTP server with speculative decoding", 8),
    (("export",), "scripts.cmd_export", "write a drafter in a serving engine's format and validate it", 7),
    (("demo",), "scripts.cmd_demo", "the whole main job on the embedded default, end to end", 9),
]


def _not_built(path: tuple[str, ...], issue: int):
    def run(args) -> int:
        print(f"draftsmith {' '.join(path)}: not built yet (tracked in issue {issue}).", file=sys.stderr)
        return 2
    return run


def add_common(parser: argparse.ArgumentParser) -> None:
    """Options every subcommand takes: a YAML recipe and `a.b=value` overrides."""
    parser.add_argument("--config", default=None, help="YAML recipe (see configs/)")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="config overrides, e.g. train.lr=3e-4 (unknown keys are errors)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="draftsmith", description="Train, measure, export and serve "
                                     "speculative-decoding drafters for a frozen target LLM.")
    top = parser.add_subparsers(dest="command", metavar="COMMAND")
    groups: dict[str, argparse._SubParsersAction] = {}
    for path, module_name, help_text, issue in COMMANDS:
        try:
            module = importlib.import_module(module_name)
            run, add_arguments = module.run, module.add_arguments
        except ModuleNotFoundError as err:
            if err.name != module_name:
                raise
            run, add_arguments, help_text = _not_built(path, issue), None, f"[not built yet] {help_text}"
        if len(path) == 1:
            sub = top.add_parser(path[0], help=help_text, description=help_text)
        else:
            if path[0] not in groups:
                group_parser = top.add_parser(path[0], help=f"{path[0]} commands")
                groups[path[0]] = group_parser.add_subparsers(dest="subcommand", metavar="SUBCOMMAND",
                                                              required=True)
            sub = groups[path[0]].add_parser(path[1], help=help_text, description=help_text)
        add_common(sub)
        if add_arguments is not None:
            add_arguments(sub)
        sub.set_defaults(func=run)
    return parser


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from serve.errors import DraftsmithError

    try:
        return int(args.func(args) or 0)
    # Every error the user can act on is a DraftsmithError (serve/errors.py); a missing path surfacing from a
    # library we call (datasets, safetensors) is one too, as far as the user is concerned.
    except (DraftsmithError, FileNotFoundError) as err:
        print(f"error: {one_line(err)}", file=sys.stderr)
        raise SystemExit(2) from None


def one_line(err: BaseException) -> str:
    return " ".join(line.strip() for line in str(err).splitlines() if line.strip()) or type(err).__name__


if __name__ == "__main__":
    sys.exit(main())
