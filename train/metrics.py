"""The training log's step records: loss per term and throughput over the window since the last record.

Pure bookkeeping fed by train/loop.py once per optimizer step; nothing here touches a process group.
"""
from __future__ import annotations

import resource
import time
from dataclasses import dataclass, field


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20  # Linux reports KiB


@dataclass
class StepStats:
    """One optimizer step on this process."""
    tokens: int                    # attended tokens this process fed, over its micro-batches
    seconds: float                 # wall time of the step
    cpu_seconds: float             # CPU time of this process
    target_seconds: float          # of which the target's forward passes (online features)
    term_sums: dict[str, float]    # this process's loss sums per term
    term_counts: dict[str, float]  # loss rows per term over all processes


@dataclass
class MetricWindow:
    """Sums over the steps since the last record; `record` turns them into the logged means and starts anew."""
    world: int                     # processes
    weights: dict[str, float]      # loss term weights
    total_steps: int
    steps_per_epoch: int
    run_start: float = field(default_factory=time.time)
    steps_done: int = 0            # steps this run has made (since a resume), for the ETA
    tokens: int = 0                # over all processes
    seconds: float = 0.0
    target_seconds: float = 0.0
    cpu_seconds: float = 0.0
    steps: int = 0
    term_sums: dict[str, float] = field(default_factory=dict)
    term_counts: dict[str, float] = field(default_factory=dict)  # over all processes, as term_sums

    def add(self, stats: StepStats) -> None:
        self.steps_done += 1
        self.tokens += stats.tokens * self.world
        self.seconds += stats.seconds
        self.target_seconds += stats.target_seconds
        self.cpu_seconds += stats.cpu_seconds
        self.steps += 1
        for name, value in stats.term_sums.items():
            self.term_sums[name] = self.term_sums.get(name, 0.0) + value
        for name, value in stats.term_counts.items():
            self.term_counts[name] = self.term_counts.get(name, 0.0) + value

    def record(self, *, step: int, lr: float) -> dict:
        """The log record after 0-based step `step`; resets the window."""
        done = step + 1
        names = sorted(self.term_counts)
        # sums and counts over every process (train_step reduces both): the global batch's per-token means
        terms = {n: self.term_sums.get(n, 0.0) / max(self.term_counts[n], 1.0) for n in names}
        per_step = (time.time() - self.run_start) / self.steps_done
        record = {"loss": sum(self.weights[n] * terms[n] for n in names), **{f"loss/{n}": v for n, v in terms.items()},
                  "lr": lr, "tokens": self.tokens,
                  "tokens_per_s": self.tokens / max(self.seconds, 1e-9),
                  "step_seconds": self.seconds / self.steps,
                  # CPU time of this process: a throughput that a busy shared machine does not distort
                  "tokens_per_cpu_s": self.tokens / self.world / max(self.cpu_seconds, 1e-9),
                  "target_share": self.target_seconds / max(self.seconds, 1e-9),
                  "eta_seconds": per_step * (self.total_steps - done), "peak_rss_gib": round(peak_rss_gib(), 3),
                  "epoch": step // self.steps_per_epoch, "processes": self.world}
        self.tokens, self.seconds, self.target_seconds, self.cpu_seconds, self.steps = 0, 0.0, 0.0, 0.0, 0
        self.term_sums, self.term_counts = {}, {}
        return record
