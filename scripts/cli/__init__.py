"""`draftsmith` command line: parse, then call one library function.

Each subcommand lives in its own module `scripts/cmd_<name>.py` exposing
`add_arguments(parser)` and `run(args) -> int`.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

# (command path, module, help)
COMMANDS = [
    (("target", "fetch-demo"), "draftsmith.cli.fetch_demo",
     "build the embedded default target into a cached HF folder, print its path"),
    (("data", "build"), "draftsmith.cli.data_build",
     "prompts -> conversations -> self-distilled responses -> tokenized dataset"),
    (("data", "capture"), "draftsmith.cli.data_capture",
     "hidden-state cache for offline training (distributed, resumable)"),
    (("train",), "draftsmith.cli.train", "train a drafter (alone or under accelerate launch / torchrun)"),
    (("eval",), "draftsmith.cli.eval", "mu per domain and speed side by side; --json and --report DIR"),
    (("generate",), "draftsmith.cli.generate", "live speculative generation of one prompt with per-cycle stats"),
    (("serve",), "draftsmith.cli.serve", "OpenAI-compatible HTTP server with speculative decoding"),
    (("export",), "draftsmith.cli.export", "write a drafter in a serving engine's format and validate it"),
    (("demo",), "draftsmith.cli.demo", "the whole main job on the embedded default, end to end"),
]


def add_common(parser: argparse.ArgumentParser) -> None:
    """Options every subcommand takes: a YAML recipe and `a.b=value` overrides."""
    parser.add_argument("--config", default=None, help="YAML recipe: a file, or a built-in recipe by name "
                        "(e.g. smollm2-135m/eagle3, demo/quick; a wrong name lists them)")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="config overrides, e.g. train.lr=3e-4 (unknown keys are errors)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="draftsmith", description="Train, measure, export and serve "
                                     "speculative-decoding drafters for a frozen target LLM.")
    top = parser.add_subparsers(dest="command", metavar="COMMAND")
    groups: dict[str, argparse._SubParsersAction] = {}
    for path, module_name, help_text in COMMANDS:
        module = importlib.import_module(module_name)
        if len(path) == 1:
            sub = top.add_parser(path[0], help=help_text, description=help_text)
        else:
            if path[0] not in groups:
                group_parser = top.add_parser(path[0], help=f"{path[0]} commands")
                groups[path[0]] = group_parser.add_subparsers(dest="subcommand", metavar="SUBCOMMAND",
                                                              required=True)
            sub = groups[path[0]].add_parser(path[1], help=help_text, description=help_text)
        add_common(sub)
        module.add_arguments(sub)
        sub.set_defaults(func=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from draftsmith.cli.errors import INTERRUPTED, describe_os_error, one_line
    from draftsmith.serve.core.errors import DraftsmithError

    from draftsmith.serve.core.process_group import finish

    try:
        code = int(args.func(args) or 0)
        finish()
        return code
    # Every error the user can act on is a DraftsmithError (serve/core/errors.py); a missing path surfacing from a
    # library we call (datasets, safetensors) is one too, as far as the user is concerned.
    except (DraftsmithError, FileNotFoundError) as err:
        print(f"error: {one_line(err)}", file=sys.stderr)
        raise SystemExit(2) from None
    except OSError as err:  # the file system refused (full, read-only, a file where a folder goes): the user's to fix
        if err.errno is None:
            raise
        print(f"error: {describe_os_error(err)}", file=sys.stderr)
        raise SystemExit(2) from None
    except KeyboardInterrupt:
        print(INTERRUPTED, file=sys.stderr)
        raise SystemExit(130) from None


if __name__ == "__main__":
    sys.exit(main())
