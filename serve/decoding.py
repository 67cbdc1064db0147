"""Plain and speculative decoding (batch 1) with exact verification and per-cycle statistics."""
from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Sequence

import torch

from draftsmith.serve.drafters.base import Draft, Drafter
from draftsmith.serve.drafters.settings import resolve_k
from draftsmith.serve.core.kv import (cache_kwargs, keep_positions, new_cache, record_states, rolls_back_trees,
                                     seq_length, sliding_window)
from draftsmith.serve.core.layers import pick_hidden_states
from draftsmith.serve.core.sampling import greedy_tokens, sample, target_probs
from draftsmith.serve.stopping import StopChecker
from draftsmith.serve.core.target_masks import for_target, window_masks
from draftsmith.serve.tree import TreeSpec, ancestor_mask, node_depths
from draftsmith.serve.core.noise import PositionNoise
from draftsmith.serve.verify import Verdict, verify_chain, verify_greedy, verify_keyed, verify_tree
from draftsmith.serve.core.target import Target


@dataclass
class SpecStats:
    cycles: int = 0
    target_forwards: int = 0  # prefill included
    new_tokens: int = 0
    accepted_per_cycle: list[int] = field(default_factory=list)
    drafted_per_cycle: list[int] = field(default_factory=list)
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    prefill_seconds: float = 0.0  # the prompt's forward and the first token (plain decoding too)
    seconds: float = 0.0
    # batched decoding (serve/batch): the row's share of the batch's wall time, each prefill and cycle split evenly
    # among the rows in it (the rows' shares add up to the batch's time; `seconds` is the row's latency)
    share_seconds: float = 0.0
    share_prefill_seconds: float = 0.0  # the part of it that was the prefill's

    @property
    def decode_seconds(self) -> float:
        """Wall time after the first token: the phase speculative decoding speeds up."""
        return self.seconds - self.prefill_seconds

    @property
    def mu(self) -> float:
        """Tokens per target forward, bonus included (the prefill's token counts for its forward)."""
        return self.new_tokens / self.target_forwards if self.target_forwards else 0.0

    @property
    def acceptance_by_position(self) -> list[float]:
        """P(draft i accepted | drafts 0..i-1 accepted), over cycles that drafted at least i tokens."""
        depth = max(self.drafted_per_cycle, default=0)
        rates = []
        for i in range(1, depth + 1):
            reached = [a for a, d in zip(self.accepted_per_cycle, self.drafted_per_cycle) if a >= i - 1 and d >= i]
            rates.append(sum(a >= i for a in reached) / len(reached) if reached else 0.0)
        return rates

    def to_dict(self) -> dict:
        out = asdict(self)
        out["mu"] = self.mu
        out["acceptance_by_position"] = self.acceptance_by_position
        return out


@dataclass
class GenerationResult:
    output_ids: list[int]
    stats: SpecStats


def new_generator(seed: int | None) -> torch.Generator | PositionNoise:
    """A request's randomness. Seeded: the noise of each output position keyed by (seed, position)
    (serve/core/noise.py), so the tokens are plain seeded decoding's alone, in any batch, with any drafter and draft
    length. Unseeded: one stream from torch's global generator, which the rejection sampler (serve/verify.py) draws
    from, accepting sampled drafts as often as any exact verifier can."""
    if seed is not None:
        return PositionNoise(seed)
    return torch.Generator().manual_seed(int(torch.randint(0, 2**62, ()).item()))


def draft_generator(gen: torch.Generator | PositionNoise, position: int):
    """What a drafter samples with when its first draft guesses output position `position`."""
    return gen.draws(position) if isinstance(gen, PositionNoise) else gen


_NOTED: set[str] = set()


def note_once(message: str) -> None:
    """Print `message` to stderr the first time this process meets it."""
    if message not in _NOTED:
        _NOTED.add(message)
        print(f"note: {message}", file=sys.stderr, flush=True)


def tree_on(model, tree: TreeSpec | None, *, recurrent: bool) -> TreeSpec | None:
    """`tree`, or None (said once) on a target whose recurrent layers cannot keep a tree's path."""
    if recurrent and tree is not None:
        note_once(f"this {model.config.model_type} target has recurrent layers, whose state a tree's branches "
                  f"cannot share: its drafts are verified as chains")
        return None
    return tree


def _hidden(out, layers: Sequence[int], rows: torch.Tensor | slice) -> dict[int, torch.Tensor]:
    """The drafter's layers of an HF output (serve.core.layers), the rows of batch entry 0: {id: (len(rows), h)}."""
    if not layers:
        return {}
    return {layer: h[0, rows] for layer, h in pick_hidden_states(out.hidden_states, layers).items()}


def stopper_for(target: Target, eos_token_ids, stop_strings) -> StopChecker:
    eos = tuple(target.eos_token_ids if eos_token_ids is None else eos_token_ids)
    return StopChecker(eos_token_ids=eos, stop_strings=tuple(stop_strings), tokenizer=target.tokenizer)


def next_token(logits: torch.Tensor, gen: torch.Generator | PositionNoise | None, position: int, **probs) -> int:
    """(V,) logits -> the token decoding emits at output position `position` (0: the first generated): the argmax
    at temperature 0, else a draw from target_probs (a seeded request's: keyed by the position)."""
    if probs["temperature"] <= 0:
        return int(greedy_tokens(logits))
    if isinstance(gen, PositionNoise):
        return gen.token(logits, position, **probs)
    return sample(target_probs(logits, **probs).cpu(), gen)


def verdict_of(draft: Draft, logits: torch.Tensor, gen: torch.Generator | PositionNoise | None, position: int,
               greedy: torch.Tensor | None = None, **probs) -> Verdict:
    """logits: (n+1, V), the target's after the pending token and after each draft node -> what it keeps.
    position: the output position row 0's token takes (the pending token's plus one). greedy: (n+1,) the argmax of
    each of those logits where the caller took them already (a batch's, in one call)."""
    tokens = draft.tokens.cpu()
    parents = draft.parents.cpu() if draft.is_tree else None
    if probs["temperature"] <= 0:  # the argmax per row, not a one-hot over the vocabulary: the same verdict
        return verify_greedy(tokens, parents, greedy_tokens(logits).cpu() if greedy is None else greedy)
    if isinstance(gen, PositionNoise):
        return verify_keyed(tokens, parents, lambda row, depth: gen.token(logits[row], position + depth, **probs))
    p = target_probs(logits, **probs).cpu()  # (n+1, V)
    if parents is not None:
        return verify_tree(tokens, parents, p, gen)
    return verify_chain(tokens, p, draft.q.cpu() if draft.q is not None else None, gen)


@torch.inference_mode()
def plain_generate(target: Target, input_ids: torch.Tensor, *, max_new_tokens: int, temperature: float = 0.0,
                   top_k: int = 0, top_p: float = 1.0, seed: int | None = None, stop_strings: Sequence[str] = (),
                   eos_token_ids: Sequence[int] | None = None,
                   on_tokens: Callable[[list[int]], None] | None = None) -> GenerationResult:
    """One target forward per token: the reference speculative decoding must reproduce."""
    model, stats, gen = target.model, SpecStats(), new_generator(seed)
    stopper = stopper_for(target, eos_token_ids, stop_strings)
    device = model.device
    cache = new_cache(model, rolls_back=False)
    t_start = time.perf_counter()
    step_input = input_ids.to(device)
    output: list[int] = []
    while len(output) < max_new_tokens:
        logits = model(step_input, **cache_kwargs(model, cache), logits_to_keep=1).logits[0, -1]
        stats.target_forwards += 1
        token = next_token(logits, gen, len(output), temperature=temperature, top_k=top_k, top_p=top_p)
        output.append(token)
        if stats.target_forwards == 1:
            stats.prefill_seconds = time.perf_counter() - t_start
        if on_tokens:
            on_tokens([token])
        if stopper.first_stop(output, len(output) - 1) is not None:
            break
        step_input = torch.tensor([[token]], device=device)
    stats.cycles = stats.target_forwards - 1
    stats.accepted_per_cycle = [0] * stats.cycles
    stats.drafted_per_cycle = [0] * stats.cycles
    stats.new_tokens = len(output)
    stats.seconds = time.perf_counter() - t_start
    stats.verify_seconds = stats.seconds
    return GenerationResult(output, stats)


def _verify_inputs(pending: int, draft: Draft, cache, device):
    """input_ids (1, n+1), position_ids (1, n+1), and for trees the attention mask: (1, 1, n+1, past+n+1) bool,
    or a dict per attention type when the target has sliding-window layers (the forward takes it through
    serve/core/target_masks.for_target)."""
    past = seq_length(cache)
    tokens = torch.cat([torch.tensor([pending]), draft.tokens.cpu()])
    if not draft.is_tree:
        positions = torch.arange(past, past + tokens.numel())
        return tokens[None].to(device), positions[None].to(device), None
    depths = torch.cat([torch.zeros(1, dtype=torch.long), node_depths(draft.parents.cpu())])
    positions = past + depths  # (n+1,)
    tree = ancestor_mask(draft.parents.cpu())  # (n+1, n+1)
    full = torch.cat([torch.ones(tree.shape[0], past, dtype=torch.bool), tree], dim=1)  # (n+1, past+n+1)
    key_positions = torch.cat([torch.arange(past), positions])  # (past+n+1,)
    window = sliding_window(cache)
    held = 0 if window is None else min(past, window - 1)  # sliding layers keep only their last window - 1 positions
    masks = window_masks(full[None, None], positions[:, None], key_positions[None, :], window=window,
                         all_sliding=all(getattr(layer, "is_sliding", False) for layer in cache.layers),
                         sliding_from=past - held)
    masks = {kind: m.to(device) for kind, m in masks.items()} if isinstance(masks, dict) else masks.to(device)
    return tokens[None].to(device), positions[None].to(device), masks


def _no_watch(cache) -> None:
    """What a drafter that is not a `Drafter` (a benchmark's stand-in) does with the target's cache: nothing."""


@torch.inference_mode()
def speculative_generate(target: Target, drafter: Drafter, input_ids: torch.Tensor, *, max_new_tokens: int,
                         k: int | None = None, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                         seed: int | None = None,
                         stop_strings: Sequence[str] = (), eos_token_ids: Sequence[int] | None = None,
                         tree: TreeSpec | None = None,
                         on_tokens: Callable[[list[int]], None] | None = None) -> GenerationResult:
    """Draft k tokens (or a tree), verify them in one target forward, keep what the target would have produced.

    input_ids: (1, T). k: None = the K the drafter records (serve/drafters/settings.py). The output
    distribution equals `plain_generate`'s; at temperature 0 the output is token-identical.
    """
    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise ValueError(f"speculative_generate takes input_ids of shape (1, T), got {tuple(input_ids.shape)}")
    k = resolve_k([drafter], k)
    model, stats, gen = target.model, SpecStats(), new_generator(seed)
    stopper = stopper_for(target, eos_token_ids, stop_strings)
    layers = tuple(drafter.target_layers)
    want_hidden = bool(layers)
    device = model.device
    cache = new_cache(model)
    for part in drafter.parts() if hasattr(drafter, "parts") else (drafter,):  # a hybrid's sides too
        getattr(part, "watch_cache", _no_watch)(cache)
    chains_only = not rolls_back_trees(cache)  # recurrent layers keep one state per position: no tree paths
    tree = tree_on(model, tree, recurrent=chains_only)
    probs = dict(temperature=temperature, top_k=top_k, top_p=top_p)
    t_start = time.perf_counter()

    out = model(input_ids.to(device), **cache_kwargs(model, cache), output_hidden_states=want_hidden,
                logits_to_keep=1)
    stats.target_forwards = 1
    pending = next_token(out.logits[0, -1], gen, 0, **probs)
    prompt = input_ids[0].cpu()
    drafter.begin(prompt, torch.cat([prompt[1:], torch.tensor([pending])]), _hidden(out, layers, slice(None)))
    del out
    output = [pending]
    stats.prefill_seconds = time.perf_counter() - t_start
    if on_tokens:
        on_tokens([pending])
    stop = stopper.first_stop(output, 0)

    cap = drafter.draft_cap(k)  # k, or more for a drafter whose per-step length may run past it (n-gram)
    while stop is None and len(output) < max_new_tokens:
        budget = min(cap, max_new_tokens - len(output) - 1)
        t0 = time.perf_counter()
        draft = drafter.propose(budget, temperature=temperature, generator=draft_generator(gen, len(output)),
                                tree=tree) if budget > 0 \
            else Draft.empty()
        if chains_only:
            draft = draft.leading_chain()  # a greedy chain's leaves are dropped
        t1 = time.perf_counter()
        past = seq_length(cache)
        ids, positions, mask = _verify_inputs(pending, draft, cache, device)
        record_states(cache, ids.shape[1])  # recurrent layers can return to any of these positions
        extra = {"attention_mask": for_target(model, mask)} if mask is not None else {}
        out = model(ids, position_ids=positions, **cache_kwargs(model, cache), output_hidden_states=want_hidden,
                    **extra)
        verdict = verdict_of(draft, out.logits[0], gen, len(output), **probs)
        rows = [0] + [i + 1 for i in verdict.accepted]  # verify-input rows the target keeps
        keep_positions(cache, past, rows)
        accepted_tokens = [int(draft.tokens[i]) for i in verdict.accepted]
        new_tokens = accepted_tokens + [verdict.next_token]
        drafter.commit(torch.tensor(new_tokens), _hidden(out, layers, torch.tensor(rows)))
        del out
        stats.target_forwards += 1
        stats.cycles += 1
        stats.accepted_per_cycle.append(len(accepted_tokens))
        stats.drafted_per_cycle.append(int(node_depths(draft.parents).max()) if draft.is_tree and len(draft)
                                       else len(draft))
        stats.draft_seconds += t1 - t0
        stats.verify_seconds += time.perf_counter() - t1
        start = len(output)
        output.extend(new_tokens)
        stop = stopper.first_stop(output, start)
        keep_to = min(stop or len(output), max_new_tokens)
        if on_tokens and keep_to > start:
            on_tokens(output[start:keep_to])
        pending = verdict.next_token
    del output[min(stop or len(output), max_new_tokens):]
    stats.new_tokens = len(output)
    stats.seconds = time.perf_counter() - t_start
    return GenerationResult(output, stats)
