"""How many CPU threads torch runs on: `--threads N` (target.threads) when given, else the cores idle right now.

torch starts one thread per physical core. When another process holds one of those cores, torch's threads wait
for each other at every op's barrier: with one of 2 cores busy elsewhere, a 2-thread self-distillation runs
several times slower than a 1-thread one (DESIGN.md; the figures are in docs/results.md). So unless told, a
command measures the cores idle when it starts (over 0.2 s, among the cores it may run on) and runs on torch's
default lowered to that many, never fewer than 1, saying so in one line. The choice is made once, at start: a
long run does not follow the load as it changes, and `--threads` pins it.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from typing import Callable

THREADS_HELP = ("torch CPU threads (default: torch's, lowered to the cores idle at start when the machine is busy; "
                "= target.threads)")
_SAMPLE_SECONDS = 0.2
_torch_default: int | None = None  # torch's own choice, read before this module first changes it


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity, e.g. under taskset or a container's cpuset)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def idle_cores(interval: float = _SAMPLE_SECONDS) -> float | None:
    """Cores idle over the next `interval` seconds among the usable ones (psutil, which accelerate brings); without
    psutil, the usable cores less the 1-minute load average; None when neither can be read."""
    try:
        import psutil
    except ImportError:
        try:
            return max(0.0, usable_cores() - os.getloadavg()[0])
        except (AttributeError, OSError):
            return None
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except AttributeError:
        cpus = None
    own = psutil.Process()
    own_before, before = own.cpu_times(), psutil.cpu_times(percpu=True)
    time.sleep(interval)
    own_after, after = own.cpu_times(), psutil.cpu_times(percpu=True)
    pairs = [(before[i], after[i]) for i in cpus if i < len(after)] if cpus else list(zip(before, after))
    # each core's idle share of the time it accounted for, not of 100%: some VMs account for only part of the
    # wall time (a firecracker VM reports 50% idle and nothing else on a quiet core)
    spans = [_accounted(b_) - _accounted(a_) for a_, b_ in pairs]
    if not pairs or min(spans) <= 0:
        return None
    idle = sum((_idle(b_) - _idle(a_)) / span for (a_, b_), span in zip(pairs, spans))
    # this process's own threads (OpenMP workers still spinning after earlier work, a tokenizer pool) do not
    # make the machine busy: the share they used counts as idle
    ours = (own_after.user - own_before.user + own_after.system - own_before.system) / (sum(spans) / len(spans))
    return min(float(len(pairs)), idle + max(0.0, ours))


def _accounted(times) -> float:
    """All of a core's accounted time (guest time is already inside user and nice on Linux)."""
    return sum(times) - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)


def _idle(times) -> float:
    return times.idle + getattr(times, "iowait", 0.0)


@dataclass(frozen=True)
class ThreadChoice:
    threads: int  # what torch runs on
    default: int  # torch's own choice
    idle: float | None  # cores idle at start (None: not measured)
    requested: int | None  # --threads / target.threads

    def note(self) -> str | None:
        """One line when the machine was busy and the default was lowered; None otherwise."""
        if self.requested is not None or self.idle is None or self.threads >= self.default:
            return None
        return (f"note: the machine is busy ({self.idle:.1f} of {usable_cores()} cores idle): torch runs on "
                f"{self.threads} thread{'s' * (self.threads != 1)} instead of {self.default} (--threads N to choose)")


def choose_threads(requested: int | None, *, default: int, idle: float | None) -> int:
    """The policy: `requested` when given; else torch's `default` lowered to the idle cores, at least 1."""
    if requested is not None:
        return requested
    if idle is None:
        return default
    return max(1, min(default, math.floor(idle + 0.25)))  # a core counts when at least 3/4 idle


def torch_default_threads() -> int:
    """torch's own thread count (OMP_NUM_THREADS, else the physical cores), as it was before we changed it."""
    global _torch_default
    if _torch_default is None:
        import torch

        _torch_default = torch.get_num_threads()
    return _torch_default


def apply_threads(requested: int | None = None, *, log: Callable[[str], None] | None = None) -> ThreadChoice:
    """Set torch's thread count by the policy (process-wide) and return the choice; `log` gets the busy note."""
    import torch

    default = torch_default_threads()
    idle = idle_cores() if requested is None and default > 1 else None  # one thread cannot be lowered
    choice = ThreadChoice(threads=choose_threads(requested, default=default, idle=idle), default=default, idle=idle,
                          requested=requested)
    torch.set_num_threads(choice.threads)
    note = choice.note()
    if note and log is not None:
        log(note)
    return choice
