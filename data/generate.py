"""Self-distillation generation with continuous batching: `slots` rows decode together, and a row that ends
hands its slot to the next prompt at once, so no row waits for the longest answer of its batch.

The KV cache (serve/core/slots.py) is one preallocated buffer pair per layer, (slots, kv_heads, capacity, head_dim). Row r holds
its sequence at columns [0, length_r) (left-aligned), a decode step writes one column per row in place and
attends over the columns up to the longest row, masked per row. Newcomers are prefilled together, left-padded
as in transformers' `generate`, and their keys and values copied into their rows.

Why not the alternatives (measured on SmolLM2-135M, CPU, fp32, one thread): `generate` with a DynamicCache
concatenates the whole cache every step (26% of a build) and runs every batch until its longest answer ends;
transformers' own continuous batching (`generate_batch`, paged cache) runs on CPU, but its SDPA path attends
each query over every request's keys under one (tokens x all keys) mask and was ~2x slower than `generate`.

Sampling draws each answer from its own generator (seeded by the caller per row and turn), so the tokens a
row gets do not depend on which rows share its batch: a resumed build equals an uninterrupted one.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Hashable, Sequence

import torch

from serve.core.kv import cache_kwargs
from serve.core.slots import SlotCache, attention_masks
from serve.core.sampling import sample, target_probs
from serve.core.target_masks import for_target


@dataclass
class Answer:
    token_ids: list[int]  # new tokens, up to and including the first EOS
    finished: bool  # ended with EOS (False: cut at max_new_tokens)


@dataclass
class Request:
    key: Hashable  # the caller's handle, returned with the answer
    prompt: Sequence[int]
    seed: int | None = None  # sampling seed of this answer (None: greedy, or a random draw)


@dataclass
class _Row:
    request: Request
    length: int  # tokens in the cache
    token_ids: list[int] = field(default_factory=list)  # generated so far; the last one is not in the cache yet
    generator: torch.Generator | None = None


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

        batcher = ContinuousBatcher(target, slots=32, max_new_tokens=256)
        batcher.add(Request("a", prompt_ids))
        while batcher.busy:
            for request, answer in batcher.step(): ...   # may add follow-up requests
    """

    def __init__(self, target: Any, *, slots: int, max_new_tokens: int, temperature: float = 0.0,
                 top_k: int = 0, top_p: float = 1.0):
        super().__init__()
        self.model = target.model
        self.eos = set(target.eos_token_ids)
        tokenizer = target.tokenizer
        self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else target.eos_token_ids[0]
        self.slots = slots
        self.max_new_tokens = max_new_tokens
        self.sampling = dict(temperature=temperature, top_k=top_k, top_p=top_p)
        self.device = next(self.model.parameters()).device
        self.rows: list[_Row | None] = [None] * slots
        self.cache: SlotCache | None = None

    @property
    def running(self) -> int:
        return sum(row is not None for row in self.rows)

    @torch.inference_mode()
    def step(self) -> list[tuple[Request, Answer]]:
        """Prefill queued prompts into free slots, or else decode one token for every running row; returns the
        answers that ended."""
        free = [r for r, row in enumerate(self.rows) if row is None]
        if self.queue and free:
            self._admit(free[: len(self.queue)])
        elif self.running:
            self._decode()
        return self._retire()

    # ---- the two kinds of forward -----------------------------------------------------------------------
    def _admit(self, rows: list[int]) -> None:
        requests = [self.queue.popleft() for _ in rows]
        lengths = [len(r.prompt) for r in requests]
        width = max(lengths)
        needed = width + self.max_new_tokens
        if self.cache is None:
            self.cache = SlotCache(self.slots, needed)
        self.cache.grow(needed)
        input_ids = torch.full((len(rows), width), self.pad, dtype=torch.long)
        real = torch.zeros((len(rows), width), dtype=torch.bool)  # (N, W) the prompt's own tokens
        for n, request in enumerate(requests):
            input_ids[n, width - lengths[n]:] = torch.as_tensor(list(request.prompt), dtype=torch.long)
            real[n, width - lengths[n]:] = True
        position_ids = (real.long().cumsum(-1) - 1).clamp_min(0)  # (N, W), as generate() numbers left-padded rows
        index = torch.arange(width)
        causal = index[:, None] >= index[None, :]  # (W, W)
        # A padded query attends to itself only, so no softmax row is empty; nothing real reads it.
        allowed = (causal[None] & real[:, None, :]) | torch.eye(width, dtype=torch.bool)[None]  # (N, W, W)
        masks = attention_masks(self.model.config, allowed[:, None], index[None, None, :, None],
                                index[None, None, None, :])
        self.cache.plan_prefill(rows, lengths)
        logits = self._forward(input_ids, position_ids, masks)  # (N, V)
        for n, (row, request) in enumerate(zip(rows, requests)):
            generator = None
            if self.sampling["temperature"] > 0:
                generator = torch.Generator()
                generator.manual_seed(request.seed if request.seed is not None
                                      else int(torch.randint(0, 2**62, ()).item()))
            self.rows[row] = _Row(request=request, length=lengths[n], generator=generator)
        self._append([self.rows[r] for r in rows], logits)

    def _decode(self) -> None:
        self._compact()
        active = self.running
        rows = self.rows[:active]
        columns = torch.tensor([row.length for row in rows])  # (A,) where each row's last token goes
        window = int(columns.max()) + 1
        keys = torch.arange(window)[None, None, None, :]  # (1, 1, 1, W)
        allowed = keys <= columns[:, None, None, None]  # (A, 1, 1, W)
        masks = attention_masks(self.model.config, allowed, columns[:, None, None, None], keys)
        input_ids = torch.tensor([[row.token_ids[-1]] for row in rows])  # (A, 1)
        self.cache.plan_decode(active, columns.to(self.device), window)
        logits = self._forward(input_ids, columns[:, None], masks)
        for row in rows:
            row.length += 1
        self._append(rows, logits)

    def _forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, masks) -> torch.Tensor:
        device = self.device
        masks = for_target(self.model, {k: m.to(device) for k, m in masks.items()} if isinstance(masks, dict)
                           else masks.to(device))
        out = self.model(input_ids=input_ids.to(device), position_ids=position_ids.to(device),
                         attention_mask=masks, logits_to_keep=1, **cache_kwargs(self.model, self.cache))
        return out.logits[:, -1]  # (B, V)

    # ---- bookkeeping ------------------------------------------------------------------------------------
    def _append(self, rows: list[_Row], logits: torch.Tensor) -> None:
        if self.sampling["temperature"] <= 0:
            tokens = logits.argmax(-1).tolist()
        else:
            probs = target_probs(logits.float(), **self.sampling).cpu()  # (B, V)
            tokens = [sample(probs[b], row.generator) for b, row in enumerate(rows)]
        for row, token in zip(rows, tokens):
            row.token_ids.append(int(token))

    def _retire(self) -> list[tuple[Request, Answer]]:
        done = []
        for r, row in enumerate(self.rows):
            if row is None:
                continue
            ended = row.token_ids[-1] in self.eos
            if ended or len(row.token_ids) >= self.max_new_tokens:
                done.append((row.request, Answer(token_ids=row.token_ids, finished=ended)))
                self.rows[r] = None
        return done

    def _compact(self) -> None:
        """Move the last running rows into the holes below them, so rows [0, running) all run."""
        while True:
            holes = [r for r, row in enumerate(self.rows) if row is None]
            last = max((r for r, row in enumerate(self.rows) if row is not None), default=-1)
            if not holes or holes[0] > last:
                return
            self.cache.move_row(last, holes[0], self.rows[last].length)
            self.rows[holes[0]], self.rows[last] = self.rows[last], None
