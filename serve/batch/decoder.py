"""The batched speculative decoder: rows advance together, each with its own drafter, accepted count, sampling
settings and stop; requests join at the next cycle and leave when done (continuous batching).

Each cycle drafts for every running row (its own drafter: `Drafter.fork` of the one given; its length policy weighs
drafts at the batch's verify costs, serve/batch/costs.py; EAGLE and Medusa heads and Gemma 4's assistant run once for
all rows per draft position, serve/drafters/base.py `propose_batch`; a drafter attending to the target's own keys and
values is handed its row of the slot cache, `Drafter.watch_cache`), cuts the drafts to the batch's best common width
(serve/batch/width.py: every row pays for the widest), verifies all rows in one target forward over the slot
cache (serve/core/slots.py, inputs from serve/batch/masks.py) and keeps, per row, the accepted prefix and the
target's next token (ragged acceptance: no row is cut back to another's count). Verification is the batch-1
decoder's (serve/decoding.py), row by row, on the row's own logits and generator, so a row's output does not
depend on the rows beside it: at temperature 0 it is the plain batched decoder's, and sampled rows keep the target's
distribution. Without a drafter every cycle is a plain step: the batched plain decoder, the baseline. A plain
decoder may also keep the hidden states its forwards compute (`record`, serve/batch/record.py: self-distillation that
captures as it generates); each row then runs one closing step that reads its last token before it leaves.

    decoder = BatchDecoder(target, drafter, slots=8)
    decoder.add(Job("a", prompt_ids, max_new_tokens=128))
    while decoder.busy:
        for done in decoder.step(): ...      # Finished(job, result, reason)
"""
from __future__ import annotations

import contextlib
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Hashable, Sequence

import torch

from draftsmith.serve.batch.costs import BatchCosts, batch_bucket
from draftsmith.serve.batch.gate import BatchGate
from draftsmith.serve.batch.masks import verify_inputs
from draftsmith.serve.batch.prefill import PREFILL_TOKENS, plan_batches
from draftsmith.serve.batch.record import Recorded, Recording, RowRecord, stacked, target_argmax
from draftsmith.serve.batch.width import batch_width, cut
from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.core.invariant import is_invariant, whole_prompt
from draftsmith.serve.core.kv import cache_kwargs, check_rollback, recurrent_layer_kinds
from draftsmith.serve.core.layers import FINAL, pick_hidden_states
from draftsmith.serve.core.slots import SlotCache, check_fits
from draftsmith.serve.core.target_config import text_config
from draftsmith.serve.core.target_masks import config_masks, for_target
from draftsmith.serve.core.noise import PositionNoise
from draftsmith.serve.core.sampling import greedy_tokens
from draftsmith.serve.decoding import (GenerationResult, SpecStats, draft_generator, new_generator, next_token,
                                       stopper_for, tree_on, verdict_of)
from draftsmith.serve.drafters.base import Draft, Drafter, prepare_batch, propose_batch
from draftsmith.serve.drafters.settings import resolve_k
from draftsmith.serve.stopping import StopChecker
from draftsmith.serve.tree import TreeSpec, node_depths
from draftsmith.serve.core.target import Target


@dataclass
class Job:
    """One request: a prompt and how to answer it."""
    key: Hashable
    prompt: Sequence[int]
    max_new_tokens: int
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop_strings: Sequence[str] = ()
    eos_token_ids: Sequence[int] | None = None  # None: the target's
    on_tokens: Callable[[list[int]], None] | None = None  # called with each cycle's new tokens (streaming)

    @property
    def probs(self) -> dict:
        return dict(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p)


@dataclass
class Finished:
    job: Job
    result: GenerationResult
    reason: str  # "stop" (EOS or stop string), "length" (max_new_tokens), "context" (the target's), "cancelled"
    recorded: Recorded | None = None  # prompt + output's states (`record`); None without, or where it could not close


@dataclass
class _Row:
    job: Job
    drafter: Drafter | None
    generator: torch.Generator | PositionNoise  # a seeded row's: keyed by output position (serve/core/noise.py)
    stopper: StopChecker
    started: float
    length: int = 0  # tokens in the cache (the pending one is not)
    pending: int = -1
    output: list[int] = field(default_factory=list)
    stats: SpecStats = field(default_factory=SpecStats)
    stop: int | None = None
    draft: Draft | None = None
    cancelled: bool = False
    record: RowRecord | None = None  # the states its forwards computed (`record`)
    closing: bool = False  # ended; its closing step reads its last token (`record`)
    closed: bool = False  # that step ran: it leaves


class BatchDecoder:
    """Runs Jobs `slots` at a time. drafter None: plain batched decoding. k: None = the drafter's recorded K.
    costs: the batch-aware verify costs (serve/batch/costs.py) that the drafters' length policies, the batch's draft
    width and its drafting gate read (None: measured on the target, per power-of-two batch size, on first use;
    False: none of the three, every row drafts as its drafter alone decides). record: keep the states of every token
    the rows' forwards read (serve/batch/record.py; plain decoding only)."""

    def __init__(self, target: Target, drafter: Drafter | None = None, *, slots: int, k: int | None = None,
                 tree: TreeSpec | None = None, costs: BatchCosts | None | bool = None,
                 record: Recording | None = None):
        if slots < 1:
            raise DraftsmithError(f"the batch needs at least one slot, got {slots}")
        if record is not None and drafter is not None:
            raise DraftsmithError("the batched decoder records hidden states while decoding plainly only (a "
                                  "drafter's verify forwards read tokens that are thrown away)")
        self.record = record
        self.target, self.model = target, target.model
        self.template = drafter
        # a drafter attending to the target's keys and values (Gemma 4's assistant) reads its row of the slot cache
        self.hands_cache = drafter is not None and any(part.reads_target_cache for part in drafter.parts())
        self.k = resolve_k([drafter], k) if drafter is not None else 0
        # a hybrid target's recurrent layers: rows prefilled alone, drafts verified as chains (serve/core/kv.py)
        self.recurrent = recurrent_layer_kinds(self.model)
        if self.recurrent and drafter is not None:
            check_rollback(self.model)
        self.tree = tree_on(self.model, tree, recurrent=bool(self.recurrent))
        self.slots = slots
        self.layers = tuple(drafter.target_layers) if drafter is not None else record.layers if record else ()
        self.costs = (BatchCosts(self.model) if costs is None else costs or None) if drafter is not None else None
        pad = target.tokenizer.pad_token_id  # what padding holds does not matter (masked); it must embed
        self.pad = pad if pad is not None and pad < self.model.get_input_embeddings().num_embeddings else 0
        self.device = next(self.model.parameters()).device
        self.dtype = next(self.model.parameters()).dtype
        self.max_positions = int(getattr(text_config(self.model.config), "max_position_embeddings", 0) or 1 << 30)
        self.queue: deque[Job] = deque()
        self.rows: list[_Row] = []  # running rows, in cache rows 0..len-1
        self.cache: SlotCache | None = None
        self._spare: list[Drafter] = []  # forks of finished rows, reused (their policies keep what they learned)
        self._gates: dict[int, BatchGate] = {}  # per power-of-two batch size: whether drafting pays at all
        self.forwards = 0  # target forwards run (prefills included)
        self.cycles = 0  # verify forwards (one cycle of every running row each)
        self.cycle_rows = 0  # rows over those cycles: the mean batch is cycle_rows / cycles

    # ---- the queue ----------------------------------------------------------------------------------------
    def add(self, job: Job, *, first: bool = False) -> None:
        if not job.prompt:
            raise DraftsmithError(f"request {job.key!r} has an empty prompt")
        if len(job.prompt) >= self.max_positions:
            raise DraftsmithError(f"request {job.key!r} has a {len(job.prompt)}-token prompt; the target holds "
                                  f"{self.max_positions} positions: shorten it")
        if job.max_new_tokens < 1:
            raise DraftsmithError(f"request {job.key!r}: max_new_tokens must be >= 1, got {job.max_new_tokens}")
        (self.queue.appendleft if first else self.queue.append)(job)

    def cancel(self, key: Hashable) -> bool:
        """Drop a queued job, or end a running one at the next step (its slot is freed, the others go on)."""
        for job in list(self.queue):
            if job.key == key:
                self.queue.remove(job)
                return True
        for row in self.rows:
            if row.job.key == key:
                row.cancelled = True
                return True
        return False

    @property
    def running(self) -> int:
        return len(self.rows)

    @property
    def busy(self) -> bool:
        return bool(self.queue) or bool(self.rows)

    # ---- one step -----------------------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self) -> list[Finished]:
        """Retire cancelled rows, then prefill queued jobs into free slots, or else run one cycle for every row;
        returns the jobs that ended."""
        done = self._retire(lambda row: row.cancelled, "cancelled")
        free = self.slots - len(self.rows)
        if self.queue and free > 0:
            jobs = [self.queue.popleft() for _ in range(min(free, len(self.queue)))]
            # batch-invariant forwards prefill each prompt alone, as batch 1 does (serve/core/invariant.py), and so
            # do recurrent layers (left padding would run through their state); the others in groups of like
            # lengths (serve/batch/prefill.py)
            alone = is_invariant(self.model) or self.recurrent
            groups = [[n] for n in range(len(jobs))] if alone else \
                plan_batches([len(job.prompt) for job in jobs], PREFILL_TOKENS)
            for group in groups:
                self._admit([jobs[n] for n in group])
        elif self.rows:
            self._cycle()
        return done + self._retire_finished()

    def run(self) -> list[Finished]:
        """Step until every job ended; the results in the order the jobs were added."""
        order = {id(job): i for i, job in enumerate(self.queue)}
        done: list[Finished] = []
        while self.busy:
            done += self.step()
        return sorted(done, key=lambda f: order.get(id(f.job), len(order)))

    # ---- prefill ------------------------------------------------------------------------------------------
    def _room(self, job: Job) -> int:
        return len(job.prompt) + job.max_new_tokens + max(self.k, 1) + 2

    def _ensure_capacity(self, needed: int) -> None:
        needed = min(needed, self.max_positions + max(self.k, 1) + 2)
        if self.cache is None:
            check_fits(self.model.config, self.dtype, self.device, slots=self.slots, capacity=needed)
            self.cache = SlotCache(self.slots, needed, recurrent=bool(self.recurrent))
        elif needed > self.cache.capacity:
            grown = max(needed, 2 * self.cache.capacity)
            check_fits(self.model.config, self.dtype, self.device, slots=self.slots, capacity=grown)
            self.cache.grow(grown)

    def _new_drafter(self) -> Drafter | None:
        if self.template is None:
            return None
        return self._spare.pop() if self._spare else self.template.fork()

    def _admit(self, jobs: list[Job]) -> None:
        started = time.perf_counter()
        lengths = [len(job.prompt) for job in jobs]
        width = max(lengths)
        self._ensure_capacity(max(self._room(job) for job in jobs))
        first = len(self.rows)
        input_ids = torch.full((len(jobs), width), self.pad, dtype=torch.long)
        real = torch.zeros((len(jobs), width), dtype=torch.bool)  # (N, W) the prompts' own tokens
        for n, job in enumerate(jobs):
            input_ids[n, width - lengths[n]:] = torch.as_tensor(list(job.prompt), dtype=torch.long)
            real[n, width - lengths[n]:] = True
        position_ids = (real.long().cumsum(-1) - 1).clamp_min(0)  # (N, W), as generate() numbers left-padded rows
        index = torch.arange(width)
        causal = index[:, None] >= index[None, :]  # (W, W)
        allowed = (causal[None] & real[:, None, :]) | torch.eye(width, dtype=torch.bool)[None]  # (N, W, W)
        masks = config_masks(self.model.config, allowed[:, None], position_ids[:, None, :, None],
                                position_ids[:, None, None, :])
        self.cache.plan_prefill(range(first, first + len(jobs)), lengths)
        with whole_prompt() if len(jobs) == 1 else contextlib.nullcontext():
            out = self._forward(input_ids, position_ids, masks, logits_to_keep=1)
        hidden = pick_hidden_states(out.hidden_states, self.layers) if self.layers else {}
        for n, job in enumerate(jobs):
            row = _Row(job=job, drafter=self._new_drafter(), generator=new_generator(job.seed),
                       stopper=stopper_for(self.target, job.eos_token_ids, job.stop_strings), started=started,
                       length=lengths[n])
            if self.record is not None:
                row.record = self._recorded_prompt(hidden, n, width - lengths[n])
            row.pending = next_token(out.logits[n, -1], row.generator, 0, **job.probs)
            row.output.append(row.pending)
            row.stats.target_forwards = 1
            if row.drafter is not None:
                prompt = torch.as_tensor(list(job.prompt), dtype=torch.long)
                own = {layer: h[n, width - lengths[n]:] for layer, h in hidden.items()}  # (T, h)
                row.drafter.begin(prompt, torch.cat([prompt[1:], torch.tensor([row.pending])]), own)
            row.stats.prefill_seconds = time.perf_counter() - started
            if job.on_tokens:
                job.on_tokens([row.pending])
            row.stop = row.stopper.first_stop(row.output, 0)
            self.rows.append(row)
        share = (time.perf_counter() - started) / len(jobs)
        for row in self.rows[first:]:
            row.stats.share_seconds += share
            row.stats.share_prefill_seconds = share

    def _recorded_prompt(self, hidden: dict[int, torch.Tensor], n: int, start: int) -> RowRecord:
        """Newcomer n's prompt states (from column `start` of the left-padded prefill) and the argmax after each."""
        record = RowRecord()
        top1 = target_argmax(self.model.get_output_embeddings(), hidden[FINAL][n, start:])  # (T,)
        record.add(stacked({layer: h[n:n + 1, start:] for layer, h in hidden.items()}, self.record.layers,
                           self.record.dtype)[0].cpu(), top1.cpu())
        return record

    # ---- one speculative cycle ----------------------------------------------------------------------------
    def _budget(self, row: _Row, cap: int) -> int:
        left = row.job.max_new_tokens - len(row.output) - 1
        room = self.max_positions - row.length - 1  # the drafts follow the pending token, all within the positions
        return max(0, min(cap, left, room))

    def _cycle(self) -> None:
        started = time.perf_counter()
        rows = self.rows
        if self.template is not None and self.costs is not None:
            self.costs.apply(rows=len(rows), drafters=[row.drafter for row in rows])
        gate = self._gate(len(rows))
        drafting = gate.should_draft() if gate is not None else self.template is not None
        started_drafts = time.perf_counter()
        if drafting and self.hands_cache:  # rows move when others leave: each cycle, the row's view as it is now
            for r, row in enumerate(rows):
                for part in row.drafter.parts():
                    part.watch_cache(self.cache.row(r, row.length))
        if drafting and len(rows) > 1:
            prepare_batch([row.drafter for row in rows])  # one head forward for all rows, where the kind can
        calls = []
        for row in rows:
            budget = self._budget(row, row.drafter.draft_cap(self.k)) if drafting else 0
            calls.append(dict(k=budget, temperature=row.job.temperature, tree=self.tree,
                              generator=draft_generator(row.generator, len(row.output))) if budget > 0 else None)
        # the rows of one kind of drafter draft together where the kind can (one head forward per position)
        drafts = propose_batch([row.drafter for row in rows], calls)  # a row not drafting: its call is None
        share = (time.perf_counter() - started_drafts) / len(rows)
        for row, draft in zip(rows, drafts):
            row.draft = draft.leading_chain() if self.recurrent else draft  # a greedy chain's leaves dropped
            row.stats.draft_seconds += share
        if self.costs is not None and self.tree is None and len(rows) > 1:
            self._fit_width(rows)
        drafts = [row.draft for row in rows]
        t1 = time.perf_counter()
        lengths = torch.tensor([row.length for row in rows])  # (A,)
        input_ids, positions, key_positions, allowed = verify_inputs([row.pending for row in rows], drafts,
                                                                     lengths, pad_id=self.pad)
        width = input_ids.shape[1]
        window = int(lengths.max()) + width
        self._ensure_capacity(window)
        masks = config_masks(self.model.config, allowed, positions[:, None, :, None], key_positions[:, None, None, :])
        self.cache.plan_write(len(rows), lengths.to(self.device), window)
        out = self._forward(input_ids, positions, masks)
        self.cycles += 1
        self.cycle_rows += len(rows)
        hidden = pick_hidden_states(out.hidden_states, self.layers) if self.layers else {}
        seconds = time.perf_counter() - t1
        # every row's argmax in one call where a row decodes greedily or states are recorded: (A, W)
        greedy = greedy_tokens(out.logits).cpu() if self.record is not None or any(
            row.job.temperature <= 0 for row in rows) else None
        if self.record is not None:  # one token a row (no drafts): its states and the target's argmax after it
            states = stacked(hidden, self.record.layers, self.record.dtype).cpu()  # (A, 1, L, h)
            for r, row in enumerate(rows):
                row.record.add(states[r].clone(), greedy[r, :1])
        for r, row in enumerate(rows):
            if row.closing:  # it only read its last token: it leaves at this step's end
                row.closed = True
            else:
                self._settle(r, row, out.logits[r], hidden, seconds, None if greedy is None else greedy[r])
        seconds = time.perf_counter() - started
        for row in rows:
            row.stats.share_seconds += seconds / len(rows)
        if gate is not None:
            tokens = sum(1 + row.stats.accepted_per_cycle[-1] for row in rows)  # this cycle's, bonus included
            gate.record_cycle(seconds, tokens / len(rows), worked=drafting)

    def _gate(self, rows: int) -> BatchGate | None:
        """The drafting gate of this batch size (serve/batch/gate.py): none for one row (its drafter's own pause rule
        decides) or without batch costs."""
        if self.template is None or self.costs is None or rows < 2:
            return None
        bucket = batch_bucket(rows)
        if bucket not in self._gates:
            self._gates[bucket] = BatchGate(self.costs(rows).step_seconds)
        return self._gates[bucket]

    def _fit_width(self, rows: list[_Row]) -> None:
        """Cut the rows' chains to the batch's best verify width (serve/batch/width.py)."""
        chains = [row.drafter.chain_acceptance(row.draft) if len(row.draft) else [] for row in rows]
        costs = self.costs(len(rows))
        width = batch_width([len(row.draft) for row in rows], chains, costs.ratio)
        for row, chain in zip(rows, chains):
            if chain is not None and len(row.draft) > width:
                row.draft = cut(row.draft, len(chain), width)

    def _settle(self, r: int, row: _Row, logits: torch.Tensor, hidden: dict, seconds: float,
                greedy: torch.Tensor | None) -> None:
        """Row r's verdict on its own logits (W, V) (greedy: their argmax (W,), taken for the batch): keep its
        accepted drafts and the target's next token."""
        draft, job = row.draft, row.job
        n = len(draft) + 1
        verdict = verdict_of(draft, logits[:n], row.generator, len(row.output),
                             greedy=None if greedy is None else greedy[:n], **job.probs)
        kept = [0] + [i + 1 for i in verdict.accepted]  # verify-input columns the target keeps
        self.cache.keep(r, row.length, kept)
        row.length += len(kept)
        new_tokens = [int(draft.tokens[i]) for i in verdict.accepted] + [verdict.next_token]
        if row.drafter is not None:
            index = torch.tensor(kept, device=logits.device)
            row.drafter.commit(torch.tensor(new_tokens), {layer: h[r].index_select(0, index)
                                                          for layer, h in hidden.items()})
        stats = row.stats
        stats.target_forwards += 1
        stats.cycles += 1
        stats.accepted_per_cycle.append(len(verdict.accepted))
        stats.drafted_per_cycle.append(int(node_depths(draft.parents).max()) if draft.is_tree and len(draft)
                                       else len(draft))
        stats.verify_seconds += seconds
        start = len(row.output)
        row.output.extend(new_tokens)
        row.stop = row.stopper.first_stop(row.output, start)
        keep_to = min(row.stop or len(row.output), job.max_new_tokens)
        if job.on_tokens and keep_to > start:
            job.on_tokens(row.output[start:keep_to])
        row.pending = verdict.next_token
        row.draft = None

    def _forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, masks, **kwargs):
        device = self.device
        masks = for_target(self.model, {k: m if m is None else m.to(device) for k, m in masks.items()}
                           if isinstance(masks, dict)
                           else masks.to(device))
        self.forwards += 1
        return self.model(input_ids=input_ids.to(device), position_ids=position_ids.to(device),
                          attention_mask=masks, output_hidden_states=bool(self.layers),
                          **cache_kwargs(self.model, self.cache), **kwargs)

    # ---- leaving ------------------------------------------------------------------------------------------
    def _reason(self, row: _Row) -> str | None:
        if row.stop is not None:
            return "stop"
        if len(row.output) >= row.job.max_new_tokens:
            return "length"
        if row.length >= self.max_positions:  # no position left for the pending token
            return "context"
        return None

    def _retire_finished(self) -> list[Finished]:
        reasons = {id(row): self._reason(row) for row in self.rows}
        if self.record is not None:  # an ended row first reads its last token (unless no position is left for it)
            for row in self.rows:
                if reasons[id(row)] is not None and row.length < self.max_positions and not row.closed:
                    row.closing = True
                    reasons[id(row)] = None
        return self._retire(lambda row: reasons[id(row)] is not None, None, reasons)

    def _retire(self, ends: Callable[[_Row], bool], reason: str | None, reasons: dict | None = None
                ) -> list[Finished]:
        done = []
        r = 0
        while r < len(self.rows):
            row = self.rows[r]
            if not ends(row):
                r += 1
                continue
            del row.output[min(row.stop or len(row.output), row.job.max_new_tokens):]
            row.stats.new_tokens = len(row.output)
            row.stats.seconds = time.perf_counter() - row.started
            recorded = None if row.record is None else \
                row.record.take(self.record.layers, len(row.job.prompt) + len(row.output))
            done.append(Finished(row.job, GenerationResult(row.output, row.stats), reason or reasons[id(row)],
                                 recorded=recorded))
            if row.drafter is not None:
                self._spare.append(row.drafter)
            last = len(self.rows) - 1
            if r != last:  # the last running row moves into the freed cache row: rows [0, running) all run
                self.cache.move_row(last, r, self.rows[last].length)
                self.rows[r] = self.rows[last]
            self.rows.pop()
        return done
