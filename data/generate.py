"""Self-distillation generation with continuous batching: `slots` rows decode together, and a row that ends
hands its slot to the next prompt at once, so no row waits for the longest answer of its batch.

The rows run on the batched decoder (serve/batch/decoder.py) without a drafter: one forward per step for every
running row over a slot cache (serve/core/slots.py) where each row holds its sequence left-aligned and is masked
per row; newcomers are prefilled together, left-padded as in transformers' `generate`.

Why not the alternatives (measured on SmolLM2-135M, CPU, fp32, one thread): `generate` with a DynamicCache
concatenates the whole cache every step (26% of a build) and runs every batch until its longest answer ends;
transformers' own continuous batching (`generate_batch`, paged cache) runs on CPU, but its SDPA path attends
each query over every request's keys under one (tokens x all keys) mask and was ~2x slower than `generate`.

Sampling draws each answer from its own generator (seeded by the caller per row and turn), so the tokens a
row gets do not depend on which rows share its batch: a resumed build equals an uninterrupted one (in float32; in
bf16 a row's rounding can differ with its batch, near-ties flip, and the answer is still the target's).

Self-distillation runs the target's ordinary kernels even where decoding runs batch-invariant ones
(serve/core/invariant.py `suspended`): invariant linears read every weight once per tile of rows (16-row tiles made
a 64-row bf16 step on a 2-core CPU cost 4x a one-row step), for answers nobody compares with batch-1 decoding; on
a CPU in bf16 its steps attend with grouped matmuls (serve/core/attention.py `grouped_attention`), which made a
build of the default target 1.7-1.8x faster on a 2-core AVX512-BF16 EPYC (scripts/bench/distill_attention.py).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Hashable, Sequence

from draftsmith.serve.batch.decoder import BatchDecoder, Job
from draftsmith.serve.batch.record import Recorded, Recording
from draftsmith.serve.core.invariant import suspended
from draftsmith.serve.core.target import Target


@dataclass
class Answer:
    token_ids: list[int]  # new tokens, up to and including the first EOS
    finished: bool  # ended with EOS (False: cut at max_new_tokens)
    recorded: Recorded | None = field(default=None, compare=False)  # prompt + answer's states, where recorded


@dataclass
class Request:
    key: Hashable  # the caller's handle, returned with the answer
    prompt: Sequence[int]
    seed: int | None = None  # sampling seed of this answer (None: greedy, or a random draw)


class RequestQueue:
    """What answers queued prompts: `add` requests, then `step` until not `busy`; each step returns the answers
    that ended. Subclasses run the requests (ContinuousBatcher in process, data.endpoint.EndpointBatcher)."""

    def __init__(self):
        self.queue: deque[Request] = deque()

    def add(self, request: Request, *, first: bool = False) -> None:
        """Queue a prompt (first=True: ahead of the others, e.g. the next turn of a conversation in flight)."""
        if first:
            self.queue.appendleft(request)
        else:
            self.queue.append(request)

    @property
    def running(self) -> int:
        raise NotImplementedError

    @property
    def busy(self) -> bool:
        return bool(self.queue) or self.running > 0

    def step(self) -> list[tuple[Request, Answer]]:
        raise NotImplementedError


class ContinuousBatcher(RequestQueue):
    """Answers queued prompts, `slots` at a time; `step()` advances every running row by one token.

        batcher = ContinuousBatcher(target, slots=32, max_new_tokens=256)   # record=Recording(...): keep states
        batcher.add(Request("a", prompt_ids))
        while batcher.busy:
            for request, answer in batcher.step(): ...   # may add follow-up requests
    """

    def __init__(self, target: Target, *, slots: int, max_new_tokens: int, temperature: float = 0.0,
                 top_k: int = 0, top_p: float = 1.0, record: Recording | None = None):
        super().__init__()
        self.decoder = BatchDecoder(target, None, slots=slots, record=record)
        self.max_new_tokens = max_new_tokens
        self.sampling = dict(temperature=temperature, top_k=top_k, top_p=top_p)

    @property
    def running(self) -> int:
        return self.decoder.running

    def step(self) -> list[tuple[Request, Answer]]:
        """Prefill queued prompts into free slots, or else decode one token for every running row; returns the
        answers that ended."""
        free = self.decoder.slots - self.decoder.running - len(self.decoder.queue)
        while self.queue and free > 0:
            request = self.queue.popleft()
            self.decoder.add(Job(request, list(request.prompt), max_new_tokens=self.max_new_tokens,
                                 seed=request.seed, **self.sampling))
            free -= 1
        with suspended(self.decoder.model):  # the ordinary kernels (see the module docstring)
            finished = self.decoder.step()
        return [(f.job.key, Answer(token_ids=f.result.output_ids, finished=f.reason == "stop", recorded=f.recorded))
                for f in finished]

