"""The requests waiting for a batch slot: a bounded FIFO that counts live clients only, and how long a refused
client should wait before it retries.

A request whose client went away leaves the queue at once (`drop`, from the event loop), not when the worker would
have taken it: at `max_batch` 1 a long request holds the only slot, and clients that gave up meanwhile must not keep
live ones out. The worker thread takes from the front, waiting while the queue is empty.
"""
from __future__ import annotations

import math
import threading
from collections import deque
from typing import Any, Sequence


class Unavailable(Exception):
    """The server cannot take the request now (a 503)."""
    code = "unavailable"


class QueueFull(Unavailable):
    code = "queue_full"


class ShuttingDown(Unavailable):
    code = "shutting_down"


class WaitingQueue:
    """Jobs waiting for a slot, at most `maxsize` of them; thread-safe."""

    def __init__(self, maxsize: int):
        if maxsize < 1:
            raise ValueError(f"maxsize must be >= 1, got {maxsize}")
        self.maxsize = maxsize
        self._jobs: deque[Any] = deque()
        self._changed = threading.Condition()
        self.closed = False

    def __len__(self) -> int:
        with self._changed:
            return len(self._jobs)

    def put(self, job: Any) -> None:
        with self._changed:
            if self.closed:
                raise ShuttingDown("the server is shutting down")
            if len(self._jobs) >= self.maxsize:
                raise QueueFull(f"{self.maxsize} requests are already waiting")
            self._jobs.append(job)
            self._changed.notify()

    def get(self, *, block: bool) -> Any | None:
        """The oldest job; None when there is none and `block` is false, or once the queue is closed."""
        with self._changed:
            while block and not self._jobs and not self.closed:
                self._changed.wait()
            if self.closed or not self._jobs:
                return None
            return self._jobs.popleft()

    def drop(self, job: Any) -> bool:
        """Take `job` out of the queue; False if it is not there (the worker took it, or it was never queued)."""
        with self._changed:
            try:
                self._jobs.remove(job)
            except ValueError:
                return False
            return True

    def close(self) -> list[Any]:
        """Refuse new jobs, wake a waiting `get`, and return the jobs that were still waiting."""
        with self._changed:
            self.closed = True
            left = list(self._jobs)
            self._jobs.clear()
            self._changed.notify_all()
            return left

    def reopen(self) -> None:
        with self._changed:
            self.closed = False


def retry_after_seconds(recent_durations: Sequence[float], *, slots: int) -> int:
    """The Retry-After of a 503, in whole seconds (at least 1): about the time until one running request ends and
    frees a place, the mean duration of the recent requests (admission to end) over the slots decoding at once.
    1 before any request has ended."""
    if not recent_durations:
        return 1
    mean = sum(recent_durations) / len(recent_durations)
    return max(1, math.ceil(mean / max(1, slots)))
