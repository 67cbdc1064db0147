"""Whether a batch drafts at all: the realized rate of the batch's drafting cycles against its plain cycles.

A row's length policy weighs its drafts against the verify costs at the batch's size, but not what the other rows'
drafting costs it: at batch B every row waits for B rows' drafters (a head's forward each) and for a verify forward
as wide as the widest row. The gate times whole cycles instead: a drafting cycle's mean tokens per row over its wall
time, against a plain cycle's one token per row over its wall time, at the same batch size. While drafting cycles
realize less than plain ones the batch skips drafting (no drafter runs), and retries ever less often
(serve/drafters/pause.py: the same rule a single drafter pauses by, here for the whole batch).
"""
from __future__ import annotations

from draftsmith.serve.drafters.pause import PauseRule


class BatchGate(PauseRule):
    """One batch size's drafting gate. step_seconds: a plain forward of that many rows, standing in for a plain
    cycle until one has been timed."""

    def __init__(self, step_seconds: float, *, smoothing: float = 0.2, explore: int = 8, max_explore: int = 64,
                 trial: int = 4, refresh: int = 32, refresh_weight: float = 0.5):
        super().__init__(smoothing=smoothing, explore=explore, max_explore=max_explore, trial=trial, refresh=refresh,
                         refresh_weight=refresh_weight)
        self.step_seconds = step_seconds

    def work_is_negligible(self) -> bool:
        return False  # even free drafts widen the verify forward of every row

    def measured_step_seconds(self) -> float:
        return self.step_seconds
