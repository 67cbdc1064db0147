"""One worker thread owns the model; requests wait in a FIFO queue and run one at a time.

Each generation builds its own KV cache inside the decoder and drops it when it ends, so requests
never share or interleave caches. The drafter instance is reused across requests, which is safe
because they never overlap and `Drafter.begin` resets its state. Results travel back to the
asyncio side as events through `loop.call_soon_threadsafe`. A request is cancelled by setting its
`cancel` flag: a queued one is skipped, a running one stops at its next streamed token (the
`on_tokens` callback raises), which frees the worker for the next request.
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Union

import torch

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
    time: float  # perf_counter when the worker took the job


@dataclass(frozen=True)
class Tokens:
    token_ids: list[int]
    time: float


@dataclass(frozen=True)
class Finished:
    result: Any  # serve.decoding.GenerationResult
    time: float


@dataclass(frozen=True)
class Failed:
    error: BaseException


@dataclass(frozen=True)
class Cancelled:
    pass


Event = Union[Started, Tokens, Finished, Failed, Cancelled]


class GenerationCancelled(Exception):
    """Raised inside `on_tokens` to abort a generation whose client went away."""


class QueueFull(Exception):
    pass


@dataclass
class Job:
    input_ids: list[int]
    params: GenerationParams
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancel: threading.Event = field(default_factory=threading.Event)
    submitted: float = field(default_factory=time.perf_counter)

    def post(self, event: Event) -> None:
        """Hand an event to the request's coroutine (called from the worker thread)."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            self.cancel.set()


class Engine:
    """Serialises generations on one worker thread. `drafter=None` means plain decoding."""

    def __init__(self, target: Any, drafter: Any | None, *, k: int = 5, tree: Any = None, max_queue: int = 64):
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        self.target = target
        self.drafter = drafter
        self.k = k
        self.tree = tree
        self.drafter_name = drafter.kind if drafter is not None else "none"
        self._queue: queue.Queue[Job | None] = queue.Queue(maxsize=max_queue)
        self._thread: threading.Thread | None = None
        self.running: Job | None = None
        self.completed = 0
        self.cancelled = 0

    @property
    def waiting(self) -> int:
        return self._queue.qsize()

    @property
    def speculation(self) -> bool:
        return self.drafter is not None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="draftsmith-engine", daemon=True)
            self._thread.start()

    def close(self, timeout: float = 10.0) -> None:
        """Cancel what is running and stop the worker once it is free."""
        if self._thread is None:
            return
        running = self.running
        if running is not None:
            running.cancel.set()
        while True:  # drop queued jobs; their coroutines see Cancelled
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job.post(Cancelled())
        self._queue.put(None)
        self._thread.join(timeout)
        self._thread = None

    def submit(self, input_ids: list[int], params: GenerationParams, loop: asyncio.AbstractEventLoop) -> Job:
        if self._thread is None:
            raise RuntimeError("engine not started")
        job = Job(input_ids=list(input_ids), params=params, loop=loop)
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            raise QueueFull(f"{self._queue.maxsize} requests are already waiting") from None
        return job

    def _work(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            if job.cancel.is_set():
                self.cancelled += 1
                job.post(Cancelled())
                continue
            self.running = job
            job.post(Started(time.perf_counter()))
            try:
                result = self.generate(job)
            except GenerationCancelled:
                self.cancelled += 1
                job.post(Cancelled())
            except Exception as err:  # a failed request must not stop the server; the client gets a 500
                log.exception("generation failed")
                job.post(Failed(err))
            else:
                self.completed += 1
                job.post(Finished(result, time.perf_counter()))
            finally:
                self.running = None

    def generate(self, job: Job) -> Any:
        """Run one generation on the calling thread, streaming tokens as events."""
        from serve.decoding import plain_generate, speculative_generate

        def on_tokens(token_ids: list[int]) -> None:
            if job.cancel.is_set():
                raise GenerationCancelled()
            job.post(Tokens([int(t) for t in token_ids], time.perf_counter()))

        p = job.params
        device = next(self.target.model.parameters()).device
        input_ids = torch.tensor([job.input_ids], dtype=torch.long, device=device)  # (1, T)
        options = dict(max_new_tokens=p.max_new_tokens, temperature=p.temperature, top_k=p.top_k,
                       top_p=p.top_p, seed=p.seed, stop_strings=p.stop_strings,
                       eos_token_ids=[] if p.ignore_eos else None, on_tokens=on_tokens)
        if self.drafter is None:
            return plain_generate(self.target, input_ids, **options)
        return speculative_generate(self.target, self.drafter, input_ids, k=self.k, tree=self.tree, **options)
