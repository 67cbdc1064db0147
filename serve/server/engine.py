"""One worker thread owns the model and a BatchDecoder (serve/batch/decoder.py) with `max_batch` slots: concurrent
requests decode together (continuous batching).

Requests wait in a bounded FIFO queue (beyond `max_queue`, `QueueFull`: a 503) that counts live clients only: a
queued request whose client went away leaves it at once (`Engine.cancel`; serve/server/waiting.py). Before each
decoder step the worker moves as many waiting requests into the decoder as it has free slots, then steps it: a step
either prefills the newcomers (one forward) or runs one speculative cycle for every running row. A request joins at
the next step and leaves when it ends, its slot going to the next one. Each row drafts with its own fork of the
drafter and samples with its own generator, so its tokens do not depend on the rows beside it: at temperature 0 they
are plain decoding's. Only the requests beyond the free slots stay in the queue, so the queue's bound keeps its meaning.

Results travel back to the asyncio side as events through `loop.call_soon_threadsafe`. A request is cancelled by
`Engine.cancel`: a queued one is dropped at once, a running one leaves the batch at the next step and frees its
slot while the others go on. `stop` (the end of a drain, serve/server/drain.py) cancels everything, and each
client is told why. A step that raises fails every request in the batch (a 500) and the decoder starts
afresh, so the server keeps serving; a request the decoder refuses (a DraftsmithError from `add`) fails alone, as a
bad request (a 400).
"""
from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Union

from draftsmith.serve.batch import decoder as batch
from draftsmith.serve.batch.costs import warm_sizes
from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.server.slot_memory import DEFAULT_KEEP_MB, release_slot_cache
from draftsmith.serve.server.waiting import QueueFull, ShuttingDown, Unavailable, WaitingQueue, retry_after_seconds
from draftsmith.serve.core.target import Target

__all__ = ["Engine", "QueueFull", "ShuttingDown", "Unavailable"]

log = logging.getLogger("draftsmith.serve")


@dataclass(frozen=True)
class GenerationParams:
    max_new_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop_strings: tuple[str, ...] = ()
    ignore_eos: bool = False


@dataclass(frozen=True)
class Started:
    time: float  # perf_counter at the start of the step that prefilled the request


@dataclass(frozen=True)
class Tokens:
    token_ids: list[int]
    time: float


@dataclass(frozen=True)
class Finished:
    result: Any  # draftsmith.serve.decoding.GenerationResult
    time: float


@dataclass(frozen=True)
class Failed:
    error: BaseException
    bad_request: bool = False  # the decoder refused the request itself (a 400), not a failed step (a 500)


SHUTDOWN_MESSAGE = "the request was cancelled (server shutting down)"


@dataclass(frozen=True)
class Cancelled:
    message: str = SHUTDOWN_MESSAGE  # what a client still listening is told


Event = Union[Started, Tokens, Finished, Failed, Cancelled]


@dataclass(eq=False)
class Job:
    input_ids: list[int]
    params: GenerationParams
    loop: asyncio.AbstractEventLoop
    id: int = 0  # the decoder's key for it
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancel: threading.Event = field(default_factory=threading.Event)
    submitted: float = field(default_factory=time.perf_counter)
    started: float | None = None  # set by the worker when the request's prefill ran

    def post(self, event: Event) -> None:
        """Hand an event to the request's coroutine (called from the worker thread)."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            self.cancel.set()


@dataclass(frozen=True)
class BatchStats:
    """What /metrics reports of the batch: its rows now, its slots, and totals since the engine started."""
    running: int  # rows decoding now (the queue's length is Engine.waiting)
    max_batch: int
    forwards: int  # target forwards, prefills included
    cycles: int  # verify forwards (one speculative cycle of every running row each)
    cycle_rows: int  # rows summed over those cycles

    @property
    def mean_batch(self) -> float:
        """Mean rows per verify forward (0 before the first)."""
        return self.cycle_rows / self.cycles if self.cycles else 0.0


class Engine:
    """Decodes up to `max_batch` requests together on one worker thread. `drafter=None` means plain decoding."""

    def __init__(self, target: Target, drafter: Any | None, *, k: int = 5, tree: Any = None, max_queue: int = 64,
                 max_batch: int = 8,
                 keep_cache_bytes: int | None = int(DEFAULT_KEEP_MB * (1 << 20))):
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.target = target
        self.drafter = drafter
        self.k = k
        self.tree = tree
        self.max_batch = max_batch
        self.drafter_name = drafter.kind if drafter is not None else "none"
        # once the batch is empty, a slot cache larger than this is freed (serve/server/slot_memory.py); None: kept
        self.keep_cache_bytes = keep_cache_bytes
        self.released_bytes = 0  # slot cache memory given back so far
        self.decoder = self._new_decoder(costs=None)
        self._queue = WaitingQueue(max_queue)
        self._stop_message = SHUTDOWN_MESSAGE
        self._durations: collections.deque[float] = collections.deque(maxlen=32)  # recent requests, admission to end
        self._ids = itertools.count(1)
        self._active: dict[int, Job] = {}  # id -> request in the decoder (its queue or a row); the worker's alone
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._step_started = 0.0
        self._lock = threading.Lock()  # the totals below, read from the event loop
        self.running = 0  # rows decoding now
        self.completed = 0
        self.cancelled = 0
        self.failed = 0
        self.forwards = 0
        self.cycles = 0
        self.cycle_rows = 0

    def _new_decoder(self, costs: Any) -> batch.BatchDecoder:
        self._seen = (0, 0, 0)  # the new decoder's forwards, cycles and rows already added to the totals
        return batch.BatchDecoder(self.target, self.drafter, slots=self.max_batch, k=self.k, tree=self.tree,
                                  costs=costs)

    @property
    def waiting(self) -> int:
        """Requests queued, not yet in the batch."""
        return len(self._queue) + len(self.decoder.queue)

    def retry_after(self) -> int:
        """Seconds a client refused with a 503 should wait before retrying (serve/server/waiting.py)."""
        with self._lock:
            durations = list(self._durations)
        return retry_after_seconds(durations, slots=self.max_batch)

    @property
    def speculation(self) -> bool:
        return self.drafter is not None

    def batch_stats(self) -> BatchStats:
        with self._lock:
            return BatchStats(running=self.running, max_batch=self.max_batch, forwards=self.forwards,
                              cycles=self.cycles, cycle_rows=self.cycle_rows)

    def start(self) -> None:
        """Start the worker. Its first work, before any request, is measuring the batch sizes' verify costs (what the
        draft-length policies, the batch's draft width and its drafting gate read): requests wait for it, the server
        answers /health meanwhile."""
        if self._thread is not None:
            return
        self._stopping.clear()
        self._queue.reopen()
        self._stop_message = SHUTDOWN_MESSAGE
        self._thread = threading.Thread(target=self._work, name="draftsmith-engine", daemon=True)
        self._thread.start()

    def _warm(self) -> None:
        costs = self.decoder.costs
        if costs is None:
            return
        sizes = warm_sizes(self.max_batch)
        log.info("measuring verify costs at batch sizes %s for batched drafting", sizes)
        t0 = time.perf_counter()
        costs.warm(sizes)
        log.info("verify costs measured in %.1f s", time.perf_counter() - t0)

    def stop(self, message: str = SHUTDOWN_MESSAGE) -> None:
        """Without waiting: refuse new requests, cancel the queued ones now and the running ones after the worker's
        current step; each client still listening is told `message`."""
        if self._thread is None:
            return
        self._stop_message = message
        self._stopping.set()
        for job in self._queue.close():  # also wakes a worker waiting for work
            self._count("cancelled")
            job.post(Cancelled(message))

    def close(self, timeout: float = 10.0) -> None:
        """Cancel what is running and queued, and stop the worker after its current step."""
        if self._thread is None:
            return
        if not self._stopping.is_set():
            self.stop()
        self._thread.join(timeout)
        self._thread = None

    def cancel(self, job: Job) -> None:
        """The client of `job` went away (called on the event loop): a queued request leaves the queue now, a
        running one the batch at the worker's next step."""
        job.cancel.set()
        if self._queue.drop(job):
            self._count("cancelled")
            job.post(Cancelled())

    def submit(self, input_ids: list[int], params: GenerationParams, loop: asyncio.AbstractEventLoop) -> Job:
        """Queue a request; QueueFull when `max_queue` live requests already wait, ShuttingDown once stopped."""
        if self._thread is None:
            raise RuntimeError("engine not started")
        if self._stopping.is_set():
            raise ShuttingDown("the server is shutting down")
        job = Job(input_ids=list(input_ids), params=params, loop=loop, id=next(self._ids))
        self._queue.put(job)
        return job

    # ---- the worker thread ------------------------------------------------------------------------
    def _work(self) -> None:
        self._warm()
        while self._take():
            self._cancel_flagged()
            if self.decoder.busy:
                self._step()
            if not self.decoder.busy:
                self._release_cache(self.keep_cache_bytes)
        for job in list(self._active.values()):
            self._end(job, Cancelled(self._stop_message))
        self.decoder = self._new_decoder(self.decoder.costs)  # drops the rows' caches
        self._set_running(0)

    def _take(self) -> bool:
        """Move queued requests into the decoder's free slots, waiting for one only while it has nothing to do.
        False: the engine is closing."""
        while not self._stopping.is_set():
            if self.max_batch - self.decoder.running - len(self.decoder.queue) <= 0:
                return True
            job = self._queue.get(block=not self.decoder.busy)
            if job is None:  # nothing waiting (the decoder has work), or the queue closed
                return not self._stopping.is_set()
            self._add(job)
        return False

    def _add(self, job: Job) -> None:
        if job.cancel.is_set():
            self._count("cancelled")
            job.post(Cancelled())
            return
        p = job.params
        try:
            self.decoder.add(batch.Job(key=job.id, prompt=job.input_ids, max_new_tokens=p.max_new_tokens,
                                       temperature=p.temperature, top_k=p.top_k, top_p=p.top_p, seed=p.seed,
                                       stop_strings=p.stop_strings, eos_token_ids=() if p.ignore_eos else None,
                                       on_tokens=self._streamer(job)))
        except DraftsmithError as err:
            self._count("failed")
            job.post(Failed(err, bad_request=True))
            return
        self._active[job.id] = job

    def _streamer(self, job: Job):
        """The decoder's on_tokens for `job`: Started at its first tokens (its prefill), then Tokens."""
        def on_tokens(token_ids: list[int]) -> None:
            if job.started is None:
                job.started = self._step_started
                job.post(Started(job.started))
            job.post(Tokens([int(t) for t in token_ids], time.perf_counter()))
        return on_tokens

    def _cancel_flagged(self) -> None:
        """Take the requests whose client went away out of the decoder: a queued one now, a running one at the
        next step (it comes back as a "cancelled" Finished)."""
        for job in list(self._active.values()):
            if not job.cancel.is_set():
                continue
            self.decoder.cancel(job.id)
            if job.started is None:  # still in the decoder's queue: every prefilled request has streamed tokens
                self._end(job, Cancelled())

    def _step(self) -> None:
        self._step_started = time.perf_counter()
        try:
            done = self.decoder.step()
        except Exception as err:  # a failed step must not stop the server: its requests get a 500
            log.exception("decoding step failed; failing the %d requests in the batch", len(self._active))
            self._collect()
            for job in list(self._active.values()):
                self._end(job, Failed(err))
            self.decoder = self._new_decoder(self.decoder.costs)
            self._set_running(0)
            return
        self._collect()
        self._set_running(self.decoder.running)
        now = time.perf_counter()
        for finished in done:
            job = self._active[finished.job.key]
            self._end(job, Cancelled() if finished.reason == "cancelled" else Finished(finished.result, now))

    def _release_cache(self, keep_bytes: int | None) -> None:
        released = release_slot_cache(self.decoder, keep_bytes=keep_bytes)
        if released:
            self.released_bytes += released
            log.info("batch idle: freed its %.0f MB slot cache (more than serve.keep_cache_mb)", released / 2**20)

    def _end(self, job: Job, event: Event) -> None:
        del self._active[job.id]
        if isinstance(event, Finished) and job.started is not None:
            with self._lock:
                self._durations.append(event.time - job.started)
        self._count({Cancelled: "cancelled", Failed: "failed", Finished: "completed"}[type(event)])
        job.post(event)

    def _count(self, name: str) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + 1)

    def _set_running(self, rows: int) -> None:
        with self._lock:
            self.running = rows

    def _collect(self) -> None:
        """Add the decoder's forwards, cycles and rows since the last call to the engine's totals."""
        seen = (self.decoder.forwards, self.decoder.cycles, self.decoder.cycle_rows)
        new = [now - before for now, before in zip(seen, self._seen)]
        self._seen = seen
        with self._lock:
            self.forwards += new[0]
            self.cycles += new[1]
            self.cycle_rows += new[2]
