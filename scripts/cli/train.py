"""`draftsmith train --config configs/<target>/<method>.yaml [key=value ...]`: train a drafter.

Runs alone or under `accelerate launch` / `torchrun` (see scripts/launch_*.sh); prints the drafter folder.
"""
from __future__ import annotations

from draftsmith.cli.plan_flags import add_plan_arguments
from draftsmith.serve.core.process_group import launch
from draftsmith.serve.core.threads import THREADS_HELP


def add_arguments(parser) -> None:
    parser.add_argument("--threads", type=int, default=None, help=THREADS_HELP)
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    parser.add_argument("--allow-other-target", action="store_true", default=None,
                        help="train on a dataset or cache made for another target of the same tokenizer and hidden "
                             "size (this target is a fine-tune of it); without it such data is refused before any "
                             "work, naming both targets (= data.allow_other_target)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace a drafter another run finished in out_dir (without it such a run is refused "
                             "before any work; the same command again needs no flag and resumes)")
    add_plan_arguments(parser)


def run(args) -> int:
    from omegaconf import OmegaConf

    from draftsmith.serve.core.config import load_config
    from draftsmith.serve.core.files import check_output_path
    from draftsmith.train.config import TrainConfig, check
    from draftsmith.train.run import train_drafter

    config = load_config(TrainConfig, config_file=args.config, overrides=args.overrides,
                         flags={"target.threads": args.threads, "data.allow_other_target": args.allow_other_target})
    if args.plan:
        from draftsmith.cli.plan_flags import plan_setting, report
        from draftsmith.train.plan import train_plan

        devices, per_node, memory = plan_setting(args)
        _, table, error = train_plan(check(config, data=False), devices=devices, per_node=per_node, device_gib=memory)
        return report(table, error)
    config = check(config)
    if args.print_config:
        print(OmegaConf.to_yaml(OmegaConf.structured(config)), end="")
        return 0
    check_output_path(config.out_dir, what="out_dir", folder=True)
    config.target.apply_threads()
    path = train_drafter(config, overwrite=args.overwrite)
    if launch().is_main:  # one line from a multi-process run, not one per process
        print(path)
    return 0
