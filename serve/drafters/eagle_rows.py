"""EAGLE heads drafting the rows of a batch together: one head forward for every row's catch-up, then one per draft
position, where row by row a batch of B rows cost B forwards of each.

Each row keeps its own head cache (serve/drafters/eagle_drafter.py) of its own length n_r. For a cycle the rows'
caches are stacked, right-padded to the longest (P columns), and the rows' committed pairs (L_r each) are written
after them, padded to the widest (W); a row attends to its own columns only:

    columns   [0, n_r)  real pairs    [n_r, P) padding    [P, P + L_r) this catch-up    then one column per step

A padding query sees itself only. A head that records its keys' positions in its cache (a sliding-window layer:
serve/drafters/masks.py) gets the rows' records stacked the same way, and each row's own back. The chains then step
together, each row's `_chain` deciding its own tokens (length policy, sampling, leaves) from its own logits, read
for all rows at once (heads_common.read_positions); a row that stops drafting idles in the batch (a query that sees
itself) until the longest chain ends. Each row's cache gets back its real pairs; its drafts are dropped, as a row's
own next catch-up would drop them.
"""
from __future__ import annotations

import time

import torch
from transformers import DynamicCache

from draftsmith.serve.drafters.base import Draft
from draftsmith.serve.drafters.heads_common import read_positions
from draftsmith.serve.drafters.leaves import LEAF_RANKS
from draftsmith.serve.drafters.masks import additive, cache_key_positions
from draftsmith.serve.core.kv import head_cache, rollback


def _held(layer) -> list[torch.Tensor]:
    """A head cache layer's tensors of one entry per token, each (B, heads, S, dim): keys, values, and DeepSeek-V3.2's
    lightning-indexer keys where the layer keeps them ((B, S, dim) there)."""
    held = [layer.keys, layer.values]
    indexer = getattr(layer, "indexer_keys", None)
    if indexer is not None and indexer.numel():
        held.append(indexer[:, None])
    return held


def _filled(head, held: list[torch.Tensor]) -> DynamicCache:
    """A cache of `head`'s kind whose layer 0 holds `held` (as _held gives them)."""
    cache = head_cache(head)
    cache.update(held[0], held[1], 0)
    if len(held) > 2:
        cache.update_indexer(held[2][:, 0], 0)
    return cache


def _stacked_past(caches: list[DynamicCache], lengths: list[int], like: torch.Tensor) -> list[torch.Tensor]:
    """The rows' head caches (layer 0: the head has one) -> their tensors (_held), (B, heads, P, dim) each,
    zero-padded (each as wide as its own dim: an MTP layer's latent attention keeps values narrower than keys)."""
    held = [_held(c.layers[0]) for c in caches if c.layers and c.layers[0].is_initialized]
    if not held:
        return []
    width = max(lengths)
    stacked = [like.new_zeros(len(caches), t.shape[1], width, t.shape[3], dtype=t.dtype) for t in held[0]]
    for r, (cache, n) in enumerate(zip(caches, lengths)):
        if n:
            for out, t in zip(stacked, _held(cache.layers[0])):
                out[r, :, :n] = t[0, :, :n]
    return stacked


def catch_up_masks(lengths: torch.Tensor, counts: torch.Tensor, past: int, width: int
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """lengths n_r, counts L_r: (B,) long -> (allowed (B, W, P + W), visible (B, P + W)) bool, for the layout above:
    a row's real query i sees its own pairs and its catch-up up to itself, a padding query itself only."""
    n, c = lengths[:, None, None], counts[:, None, None]
    query = torch.arange(width)[None, :, None]  # (1, W, 1)
    column = torch.arange(past + width)[None, None, :]  # (1, 1, P + W)
    caught = (column >= past) & (column - past <= query)  # (1, W, P + W): this catch-up, causal
    real = query < c  # (B, W, 1)
    allowed = (real & ((column < n) | caught)) | (~real & (column == past + query))
    visible = (column[:, 0] < n[:, 0]) | ((column[:, 0] >= past) & (column[:, 0] < past + c[:, 0]))  # (B, P + W)
    return allowed, visible


def _catch_up(drafters: list) -> tuple[DynamicCache, torch.Tensor]:
    """Run every row's committed pairs in one head forward. Returns the batch's cache (B, .., P + W, ..) and which of
    its columns each row may see (B, P + W) bool; each drafter's own cache, n, last output and logits are updated."""
    first = drafters[0]
    device, dtype = first.device, first.dtype
    lengths, runs = [], []
    for d in drafters:
        rollback(d._cache, d.n)
        lengths.append(d.n)
        runs.append(d._take_pending())
    counts = [0 if run is None else int(run[0].numel()) for run in runs]
    past, width = max(lengths), max(1, max(counts))
    rows = len(drafters)
    token_ids = torch.zeros(rows, width, dtype=torch.long)
    features: dict = {}  # layer -> (B, W, h) the rows' target states, zero-padded: one input_hidden for all rows
    for r, (run, count) in enumerate(zip(runs, counts)):
        if count:
            tokens, states = run
            for layer, state in states.items():
                if layer not in features:
                    features[layer] = torch.zeros(rows, width, state.shape[-1], device=device, dtype=dtype)
                features[layer][r, :count] = state.to(device, dtype)
            token_ids[r, :count] = tokens
    allowed, visible = catch_up_masks(torch.tensor(lengths), torch.tensor(counts), past, width)
    positions = torch.tensor(lengths)[:, None] + torch.arange(width)  # (B, W)
    hidden = first.head.input_hidden(features) if features else \
        torch.zeros(rows, width, first.head.config.hidden_size, device=device, dtype=dtype)  # (B, W, h)
    stacked = _stacked_past([d._cache for d in drafters], lengths, hidden)
    cache = _filled(first.head, stacked) if stacked else head_cache(first.head)
    if stacked:
        records = [cache_key_positions(d._cache) for d in drafters]
        if any(record is not None for record in records):
            cache.key_positions = torch.zeros(rows, past, dtype=torch.long, device=device)  # padding: never seen
            for r, (record, n) in enumerate(zip(records, lengths)):
                if n:
                    cache.key_positions[r, :n] = record[0, :n]
    embeds = first.embed(token_ids.to(first.embed.weight.device)).to(device, dtype)  # (B, W, h)
    with torch.no_grad():
        out = first.head(hidden, embeds, position_ids=positions.to(device),
                         attention_mask=additive(allowed.to(device), dtype), cache=cache)  # (B, W, h)
    held = _held(cache.layers[0])  # each (B, heads, P + W, dim)
    record = cache_key_positions(cache)  # (B, P + W) where the head records its keys' positions
    ran = [r for r, count in enumerate(counts) if count]
    if ran:
        last = torch.stack([out[r, counts[r] - 1] for r in ran])  # (m, h)
        with torch.no_grad():
            logits = first._logits_of(last)  # (m, Vd)
        for i, r in enumerate(ran):
            d, n, count = drafters[r], lengths[r], counts[r]
            own = _filled(d.head, [torch.cat([t[r: r + 1, :, :n], t[r: r + 1, :, past: past + count]], dim=2)
                                   for t in held])
            if record is not None:
                own.key_positions = torch.cat([record[r: r + 1, :n], record[r: r + 1, past: past + count]], dim=1)
            d._cache, d.n = own, n + count
            d._last_out, d._last_logits = last[i], logits[i]
    return cache, visible


def propose_chains(drafters: list, calls: list[dict]) -> list[Draft]:
    """EagleDrafter.propose for every row (calls[i]: k, temperature, generator; chains only), the head run once per
    catch-up and per draft position for all rows."""
    drafts: list[Draft | None] = [None] * len(drafters)
    open_rows = []
    for i, d in enumerate(drafters):
        if d.last.open(d.policy):
            open_rows.append(i)
        else:
            drafts[i] = Draft.empty()
    group = [drafters[i] for i in open_rows]
    if not group:
        return drafts
    start = time.perf_counter()
    cache, visible = _catch_up(group)
    share = (time.perf_counter() - start) / len(group)
    for d in group:
        d.policy.record_overhead(share)
    # every row's first position read in one go (heads_common.read_positions), each later one with its step's
    readings = read_positions(torch.stack([d._last_logits for d in group]), LEAF_RANKS)
    chains, requests = {}, {}
    for r, i in enumerate(open_rows):
        call = calls[i]
        chains[r] = group[r]._chain(call["k"], call.get("temperature", 0.0), call.get("generator"), readings[r])
        try:
            requests[r] = next(chains[r])
        except StopIteration as done:
            drafts[i] = done.value
    first = group[0]
    device, dtype = first.device, first.dtype
    while requests:
        start = time.perf_counter()
        rows = len(group)
        columns = visible.shape[1]
        stepped = list(requests)
        hidden = torch.zeros(rows, 1, first.head.config.hidden_size, device=device, dtype=dtype)
        token_ids = torch.zeros(rows, 1, dtype=torch.long)
        positions = torch.zeros(rows, 1, dtype=torch.long)
        hidden[stepped, 0] = torch.stack([requests[r][0] for r in stepped]).to(device, dtype)
        token_ids[stepped, 0] = torch.cat([requests[r][1] for r in stepped])
        positions[stepped, 0] = torch.tensor([requests[r][2] for r in stepped])
        # a stepping row sees its columns and its own earlier drafts, an idle one itself
        stepping = torch.zeros(rows, 1, dtype=torch.bool)
        stepping[stepped] = True
        visible = torch.cat([visible, torch.ones(rows, 1, dtype=torch.bool)], dim=1)  # (B, columns + 1)
        allowed = (visible & stepping) | (torch.arange(columns + 1) == columns)[None]  # (B, columns + 1)
        embeds = first.embed(token_ids.to(first.embed.weight.device)).to(device, dtype)
        with torch.no_grad():
            out = first.head(hidden, embeds, position_ids=positions.to(device),
                             attention_mask=additive(allowed[:, None].to(device), dtype), cache=cache)[:, 0]
            logits = first._logits_of(out[stepped])  # (m, Vd)
        readings = read_positions(logits, LEAF_RANKS)
        visible[:, -1] = stepping[:, 0]  # a drafted column is seen by its own row's later steps only
        share = (time.perf_counter() - start) / len(stepped)
        for m, r in enumerate(stepped):
            group[r].policy.record_step(share)
            try:
                requests[r] = chains[r].send((out[r], logits[m], readings[m]))
            except StopIteration as done:
                drafts[open_rows[r]] = done.value
                del requests[r]
    return drafts
