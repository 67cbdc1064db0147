"""Agreement of a head with the target on rows it does not train on (and on a sample it does), during training.

What is logged at every evaluation: top-1 agreement by drafted position on the held-out rows and on as many
training rows, and `mu_tf`, the chain's mean accepted length estimated teacher-forced (serve/methods/objective.py
Agreement). The held-out curve is what tells under-fitting from over-fitting, picks the best checkpoint and stops
training early.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from draftsmith.serve.methods.objective import Agreement, Objective


def agreement_over(objective: Objective, rows, indices: Sequence[int], make_batch: Callable[[list], tuple],
                   positions: int, *, batch_size: int = 1) -> Agreement:
    """Agreement sums of `objective`'s head over rows[indices] (this process's share; reduce before rating)."""
    total = Agreement.zeros(positions)
    for start in range(0, len(indices), batch_size):
        batch, _ = make_batch([rows[i] for i in indices[start:start + batch_size]])
        total.add(objective.agreement(batch, positions))
    return total


@dataclass
class BestTracker:
    """Keeps the head state with the best held-out score and says when `patience` evaluations brought nothing.

    score: held-out mu_tf (the chain's estimated accepted length; it weighs every drafted position the way
    decoding does). min_delta: improvements smaller than this do not reset the patience."""
    patience: int = 0          # evaluations without improvement before stopping; 0 = never stop early
    min_delta: float = 1e-3
    best_score: float = float("-inf")
    best_step: int = -1
    best_state: dict | None = field(default=None, repr=False)
    stale: int = 0

    def update(self, score: float, step: int, state: Callable[[], dict]) -> bool:
        """Record an evaluation; returns True when it is the new best (its state is then copied)."""
        if score > self.best_score + self.min_delta or self.best_state is None:
            self.best_score, self.best_step, self.stale = score, step, 0
            self.best_state = {k: v.detach().to("cpu", copy=True) for k, v in state().items()}
            return True
        self.stale += 1
        return False

    @property
    def should_stop(self) -> bool:
        return self.patience > 0 and self.stale >= self.patience

    def to_json(self) -> dict:
        return {"best_score": self.best_score, "best_step": self.best_step, "stale": self.stale}


def sample_rows(indices: Sequence[int], count: int, *, seed: int) -> list[int]:
    """A fixed, seeded sample of training rows to measure train agreement on (the same rows every evaluation)."""
    if count >= len(indices):
        return list(indices)
    order = torch.randperm(len(indices), generator=torch.Generator().manual_seed(seed + 101)).tolist()
    return [indices[i] for i in order[:count]]
