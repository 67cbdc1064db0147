"""The process group of a launch (`torchrun`, `accelerate launch`, scripts/launch_*.sh): started once with a clear
error when it cannot be, and the check that every process runs the same recipe on the same target files before any
work. accelerate reuses a group started here (its PartialState starts one only when none exists)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

from draftsmith.serve.core.errors import DraftsmithError

# Loading a 70B target shard by shard and the first all-gathers can take long on a busy file system.
TIMEOUT = timedelta(minutes=60)


@dataclass(frozen=True)
class Launch:
    rank: int
    world: int
    local_rank: int
    local_world: int  # processes on this node

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def launch() -> Launch:
    """This process's place in the launch, from the environment torchrun and accelerate set (alone: 0 of 1)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return Launch(rank=int(os.environ.get("RANK", "0")), world=world,
                  local_rank=int(os.environ.get("LOCAL_RANK", "0")),
                  local_world=int(os.environ.get("LOCAL_WORLD_SIZE", str(world))))


def launch_command(command: str) -> str:
    return (f"`torchrun --nproc-per-node N -m draftsmith.cli {command}` on one node, scripts/launch_multi_node.sh on "
            f"several")


def start(*, device_type: str, command: str, backend: str = "auto") -> Launch:
    """Start the process group of a launch of several processes (gloo on CPUs, NCCL on GPUs, or `backend`); a
    DraftsmithError naming the launch command when the backend is missing or the rendezvous fails."""
    import torch
    import torch.distributed as dist

    here = launch()
    if here.world <= 1:
        return here
    if not dist.is_available():
        raise DraftsmithError(f"this torch build has no torch.distributed, which a launch of {here.world} processes "
                              f"needs: install a torch with distributed support, or run one process")
    if dist.is_initialized():
        return here
    if backend == "auto":
        backend = "nccl" if device_type == "cuda" else "gloo"
    available = {"nccl": dist.is_nccl_available, "gloo": dist.is_gloo_available}.get(backend)
    if available is not None and not available():
        raise DraftsmithError(f"the {backend} backend is not available in this torch build, and {here.world} "
                              f"processes need it (gloo on CPUs, NCCL on GPUs); install a torch built with it, set "
                              f"distributed.backend, or launch with {launch_command(command)}")
    missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(name)]
    if missing:
        raise DraftsmithError(f"WORLD_SIZE={here.world} but {', '.join(missing)} is not set: start the processes "
                              f"with {launch_command(command)}")
    if backend == "nccl":
        torch.cuda.set_device(here.local_rank)
    try:
        dist.init_process_group(backend=backend, timeout=TIMEOUT)
    except (RuntimeError, ValueError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise DraftsmithError(f"could not start the {backend} process group of {here.world} processes ({first}); "
                              f"launch with {launch_command(command)}") from None
    return here


def finish() -> None:
    """End this process's part of the launch: destroy the process group once the work is done, on every process, so
    that gloo's worker threads stop while the interpreter is alive (left to the interpreter's exit, they abort the
    process now and then: "terminate called without an active exception"). Only after success: a process that
    failed exits without it, since destroying a group others still wait on can hang. Alone it does nothing."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def check_same(values: dict[str, str], *, what: dict[str, str]) -> None:
    """DraftsmithError when the processes of the launch disagree on any of `values` (name -> fingerprint).
    `what[name]` says what to make equal. Call on every process, before any work; alone it does nothing."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, values)
    for name in values:
        seen = [g.get(name) for g in gathered]
        if len(set(seen)) > 1:
            other = next(r for r, v in enumerate(seen) if v != seen[0])
            raise DraftsmithError(f"the processes disagree on the {name}: rank 0 has {seen[0]}, rank {other} "
                                  f"{seen[other]}; {what.get(name, 'launch every process with the same inputs')}")
