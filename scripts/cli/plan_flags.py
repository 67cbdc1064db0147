"""`--plan` of `draftsmith train` and `draftsmith data capture`: the per-device memory of a launch before any work,
from the recipe and the target's config alone (a built-in config name such as llama-3.3-70b works as --target)."""
from __future__ import annotations

from draftsmith.serve.core.known_configs import KNOWN_CONFIGS
from draftsmith.serve.core.process_group import launch

DEFAULT_DEVICE_GIB = 80.0  # an 80 GB H100 / A100 when no GPU is visible


def add_plan_arguments(parser) -> None:
    parser.add_argument("--plan", action="store_true",
                        help="print the per-device memory plan and the parallel layout (target.parallel), refuse a "
                             "layout that cannot fit naming the smallest one that would, and exit; needs no weights: "
                             f"the target may be a folder with config.json or one of {', '.join(KNOWN_CONFIGS)}")
    parser.add_argument("--devices", type=int, default=None,
                        help="--plan: processes (GPUs) of the launch (default: WORLD_SIZE, else the visible GPUs, "
                             "else 1)")
    parser.add_argument("--per-node", type=int, default=None,
                        help="--plan: GPUs per node; TP groups stay within one (default: LOCAL_WORLD_SIZE, else 8)")
    parser.add_argument("--device-memory", type=float, default=None,
                        help=f"--plan: GiB per device (default: the visible GPU's, else {DEFAULT_DEVICE_GIB:.0f})")


def plan_setting(args) -> tuple[int, int, float]:
    """(devices, per node, GiB per device) of --plan: the flags, else this machine, else 80 GiB GPUs."""
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    here = launch()  # under torchrun / accelerate launch, the launch's own size
    devices = args.devices or (here.world if here.world > 1 else gpus) or 1
    per_node = args.per_node or (here.local_world if here.world > 1 else 8)
    memory = args.device_memory
    if memory is None:
        memory = torch.cuda.get_device_properties(0).total_memory / (1 << 30) if gpus else DEFAULT_DEVICE_GIB
    return devices, per_node, memory


def report(table: str, error: str | None) -> int:
    """Print the plan's table; a refusal becomes the command's one-line error (exit 2)."""
    from draftsmith.serve.core.errors import ConfigError

    print(table)
    if error:
        raise ConfigError(error)
    return 0
