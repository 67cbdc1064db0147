"""`draftsmith demo [--quick]`: the whole main job on the embedded default target."""
from __future__ import annotations

from pathlib import Path

from serve.threads import THREADS_HELP

CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "demo"


def add_arguments(parser) -> None:
    parser.add_argument("--quick", action="store_true", help="toy scale, a few minutes (what CI runs)")
    parser.add_argument("--threads", type=int, default=None, help=THREADS_HELP)
    parser.add_argument("--out", default=None, help="output folder (default runs/demo or runs/demo-quick)")


def run(args) -> int:
    from scripts.demo import DemoConfig, run_demo
    from serve.config import load_config
    from serve.files import check_output_path

    recipe = args.config or CONFIGS / ("quick.yaml" if args.quick else "full.yaml")
    config = load_config(DemoConfig, config_file=recipe, overrides=args.overrides,
                         flags={"out_dir": args.out, "target.threads": args.threads})
    check_output_path(config.out_dir, what="demo folder", folder=True)
    config.target.apply_threads()  # once for every stage
    run_demo(config)
    return 0
