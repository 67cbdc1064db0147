"""What happens at which step: the data order, the learning rate, and when to log, evaluate and checkpoint.

Pure functions of the step, so a resumed run needs nothing but the step it stopped at.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from draftsmith.train.config import TrainConfig


def lr_lambda(config: TrainConfig, total_steps: int) -> Callable[[int], float]:
    warmup, kind = config.optim.warmup_steps, config.optim.schedule

    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        if kind == "constant":
            return 1.0
        progress = (step - warmup) / max(total_steps - warmup, 1)
        return 0.5 * (1 + math.cos(math.pi * progress)) if kind == "cosine" else max(0.0, 1 - progress)

    return factor


class DataOrder:
    """Global batches of row indices: per-epoch seeded permutations, the remainder of an epoch dropped.

    Step s uses rows stream[s*G:(s+1)*G] (G = batch per process x processes x grad_accum); micro-batch a of
    process r takes the slice ((a*world + r)*b, +b). Resuming at step s needs nothing but s.
    """

    def __init__(self, train_rows: list[int], *, seed: int, global_batch: int):
        self.rows, self.seed, self.global_batch = train_rows, seed, global_batch
        self.steps_per_epoch = len(train_rows) // global_batch
        self._epoch, self._perm = -1, []

    def batch(self, step: int) -> list[tuple[int, int]]:
        """[(stream position, row index)] of global step `step`."""
        epoch, within = divmod(step, self.steps_per_epoch)
        if epoch != self._epoch:
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch + 1)
            self._perm = [self.rows[i] for i in torch.randperm(len(self.rows), generator=gen).tolist()]
            self._epoch = epoch
        start = within * self.global_batch
        return [(step * self.global_batch + i, self._perm[start + i]) for i in range(self.global_batch)]

    def micro_batches(self, step: int, *, batch_size: int, grad_accum: int, world: int,
                      rank: int) -> list[list[tuple[int, int]]]:
        """Process `rank`'s grad_accum micro-batches of step `step`: [[(stream position, row index)] * batch_size]."""
        stream, b = self.batch(step), batch_size
        return [stream[(a * world + rank) * b:(a * world + rank + 1) * b] for a in range(grad_accum)]


@dataclass(frozen=True)
class Cadence:
    """When a finished step `done` (1-based) logs, evaluates and checkpoints. The last step always logs and (with
    periodic evaluation) evaluates; it never checkpoints, since the run writes its result right after."""
    total_steps: int
    log_every: int
    eval_every: int        # 0: no periodic evaluation
    checkpoint_every: int  # 0: no checkpoints

    @classmethod
    def of(cls, config: TrainConfig, total_steps: int, *, periodic_eval: bool) -> "Cadence":
        return cls(total_steps=total_steps, log_every=max(config.log.every, 1),
                   eval_every=config.log.eval_every if periodic_eval else 0,
                   checkpoint_every=config.checkpoint.every)

    def logs(self, done: int) -> bool:
        return done % self.log_every == 0 or done == self.total_steps

    def evaluates(self, done: int) -> bool:
        return self.eval_every > 0 and (done % self.eval_every == 0 or done == self.total_steps)

    def checkpoints(self, done: int) -> bool:
        return bool(self.checkpoint_every) and done % self.checkpoint_every == 0 and done != self.total_steps


CALIBRATION_STEPS = 8  # steps timed before a time budget fixes the run's length
REFIT_EVERY = 50  # steps between later fits (the rate settles after the first steps)


def steps_within(max_seconds: float, *, elapsed: float, step_seconds: float, eval_seconds: float, eval_every: int,
                 done: int, total_steps: int) -> int:
    """The last step a run can reach within `max_seconds` (optim.max_seconds), never past total_steps and never
    before `done`: the steps left at `step_seconds` each, less the evaluations they bring (one every `eval_every`
    steps, plus the final one, `eval_seconds` each)."""
    left = max_seconds - elapsed - eval_seconds  # the final evaluation
    per_step = step_seconds + (eval_seconds / eval_every if eval_every > 0 else 0.0)
    return max(done, min(total_steps, done + int(max(left, 0.0) // max(per_step, 1e-9))))
