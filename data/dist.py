"""The data-parallel context of a capture: rank, world size, a barrier. Alone, or under `accelerate launch`
/ `torchrun` (accelerate's PartialState reads their environment and sets up the process group:
gloo on CPU, NCCL on GPUs)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from draftsmith.serve.core.process_group import launch


@dataclass
class Dist:
    rank: int
    world: int
    device: Any  # torch.device of this rank
    _state: Any = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self._state is not None and self.world > 1:
            self._state.wait_for_everyone()


def current(*, cpu: bool | None = None) -> Dist:
    """This process's place in the launch (a single process when not launched).

    cpu: run on CPU (gloo between processes); default: when no GPU is present. PartialState needs it said
    explicitly, or it treats every CPU process of a launch as a world of its own.
    """
    import torch

    if cpu is None:
        cpu = not torch.cuda.is_available()
    if launch().world <= 1:
        return Dist(rank=0, world=1, device=torch.device("cpu" if cpu else "cuda"))
    from accelerate import PartialState

    state = PartialState(cpu=cpu)
    return Dist(rank=state.process_index, world=state.num_processes, device=state.device, _state=state)
