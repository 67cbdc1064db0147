"""`draftsmith demo [--quick] [--model NAME]`: the whole main job on an embedded target (SmolLM2-135M-Instruct by
default; `--model gemma3-270m` runs configs/demo/gemma3-270m.yaml on Gemma-3-270M)."""
from __future__ import annotations

from draftsmith.serve.core.threads import THREADS_HELP


def add_arguments(parser) -> None:
    parser.add_argument("--quick", action="store_true", help="toy scale, a few minutes (what CI runs)")
    parser.add_argument("--threads", type=int, default=None, help=THREADS_HELP)
    parser.add_argument("--out", default=None, help="output folder (default runs/demo, runs/demo-quick or "
                                                    "runs/demo-MODEL)")
    parser.add_argument("--budget", default=None,
                        help="wall-clock budget, e.g. 30m or 1h (default: the recipe's, 30m for `make demo`; off = "
                             "the recipe as written): the machine is measured and every stage sized to it")
    parser.add_argument("--model", default=None, help="an embedded target (`draftsmith target fetch-demo --help`): "
                                                      "runs its recipe configs/demo/MODEL.yaml")


def run(args) -> int:
    from draftsmith.demo.run import DemoConfig, run_demo
    from draftsmith.serve.core.config import load_config
    from draftsmith.serve.core.files import check_output_path
    from draftsmith.serve.core.recipes import builtin_dir

    demo_recipes = builtin_dir() / "demo"  # the built-in recipes: package data, found from any folder
    recipe = args.config or demo_recipes / ("quick.yaml" if args.quick else "full.yaml")
    flags = {"out_dir": args.out, "target.threads": args.threads, "budget": args.budget}
    if args.model:
        from draftsmith.serve.core.demo_target import DEFAULT_MODEL, DEMO_MODELS
        from draftsmith.serve.core.errors import DraftsmithError

        if args.model not in DEMO_MODELS:
            raise DraftsmithError(f"--model {args.model!r}: choose one of {', '.join(sorted(DEMO_MODELS))}")
        if args.model != DEFAULT_MODEL:
            if not args.config and not args.quick:
                recipe = demo_recipes / f"{args.model}.yaml"
            elif args.quick and not DEMO_MODELS[args.model].chat:
                flags["data.chat"] = False  # the quick recipe's prompts as plain text for a base model
            flags["target.spec"] = f"demo:{args.model}"
            flags["out_dir"] = args.out or f"runs/demo-{args.model}" + ("-quick" if args.quick else "")
    config = load_config(DemoConfig, config_file=recipe, overrides=args.overrides, flags=flags)
    check_output_path(config.out_dir, what="demo folder", folder=True)
    config.target.apply_threads()  # once for every stage
    run_demo(config)
    return 0
