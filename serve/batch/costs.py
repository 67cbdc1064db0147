"""Verify costs at the batch size the decoder runs: V(n, B) / V(0, B), what a draft of n tokens per row costs over
a plain step of the same B rows.

A forward over B rows of 1 token each is memory-bound (the weights are read once for every row); drafting adds
rows' tokens until the forward is compute-bound, where n drafts cost n + 1 steps and drafting never pays. The
length policies (serve/drafters/length.py) weigh each draft against the costs of the current batch, so drafting
shrinks as the batch grows and stops where the batch is compute-bound. Costs are measured per power-of-two
batch size on first use (serve/core/costs.py), the next size up standing in for the ones between.
"""
from __future__ import annotations

from typing import Callable, Iterable

from draftsmith.serve.core.costs import VerifyCosts, verify_costs_for


def batch_bucket(rows: int) -> int:
    """The power of two at or above `rows`: the batch size whose costs stand in for it."""
    bucket = 1
    while bucket < rows:
        bucket *= 2
    return bucket


def warm_sizes(max_batch: int) -> list[int]:
    """The power-of-two batch sizes whose verify costs a batch of up to `max_batch` rows reads: a batch shrinks as
    its rows end, down to one."""
    return [1 << i for i in range(batch_bucket(max_batch).bit_length())]


class BatchCosts:
    """costs(rows) -> VerifyCosts; `measure(bucket)` is called once per bucket (default: measured on the model)."""

    def __init__(self, model=None, *, measure: Callable[[int], VerifyCosts] | None = None):
        if measure is None and model is None:
            raise ValueError("BatchCosts needs a model to measure or a measure function")
        self.measure = measure or (lambda bucket: verify_costs_for(model, bucket))
        self.measured: dict[int, VerifyCosts] = {}

    def __call__(self, rows: int) -> VerifyCosts:
        bucket = batch_bucket(rows)
        if bucket not in self.measured:
            self.measured[bucket] = self.measure(bucket)
        return self.measured[bucket]

    def warm(self, rows: Iterable[int]) -> None:
        """Measure now the buckets of these batch sizes (before a timed run; every size a batch passes through as its
        rows end: `warm_sizes`)."""
        for n in rows:
            self(n)

    def apply(self, *, rows: int, drafters: Iterable) -> None:
        """Every drafter's length policies weigh drafts at `rows` rows from now on."""
        costs = self(rows)
        for drafter in drafters:
            for policy in drafter.policies():
                if hasattr(policy, "use_costs"):
                    policy.use_costs(costs)
