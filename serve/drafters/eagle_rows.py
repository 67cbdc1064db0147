"""EAGLE heads drafting the rows of a batch together: one head forward for every row's catch-up, then one per draft
position, where row by row a batch of B rows cost B forwards of each.

Each row keeps its own head cache (serve/drafters/eagle_drafter.py) of its own length n_r. For a cycle the rows'
caches are stacked, right-padded to the longest (P columns), and the rows' committed pairs (L_r each) are written
after them, padded to the widest (W); a row attends to its own columns only:

    columns   [0, n_r)  real pairs    [n_r, P) padding    [P, P + L_r) this catch-up    then one column per step

A padding query sees itself only. A head that records its keys' positions in its cache (a sliding-window layer:
serve/drafters/masks.py) gets the rows' records stacked the same way, and each row's own back. The chains then step
together, each row's `_chain` deciding its own tokens (length policy, sampling, leaves) from its own logits; a row
that stops drafting idles in the batch (a query that sees itself) until the longest chain ends. Each row's cache gets
back its real pairs; its drafts are dropped, as a row's own next catch-up would drop them.
"""
from __future__ import annotations

import time

import torch
from transformers import DynamicCache

from draftsmith.serve.drafters.base import Draft
from draftsmith.serve.drafters.masks import additive, cache_key_positions
from draftsmith.serve.core.kv import rollback


def _stacked_past(caches: list[DynamicCache], lengths: list[int], like: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The rows' head caches (layer 0: the head has one) -> keys, values (B, kv_heads, P, head_dim), zero-padded
    (values as wide as their own head_dim: an MTP layer's latent attention keeps them narrower than the keys)."""
    held = [c.layers[0] for c in caches if c.layers and c.layers[0].is_initialized]
    if not held:
        return ()
    _, kv_heads, _, dim = held[0].keys.shape
    width = max(lengths)
    keys = like.new_zeros(len(caches), kv_heads, width, dim, dtype=held[0].keys.dtype)
    values = like.new_zeros(len(caches), held[0].values.shape[1], width, held[0].values.shape[-1],
                            dtype=held[0].values.dtype)
    for r, (cache, n) in enumerate(zip(caches, lengths)):
        if n:
            keys[r, :, :n] = cache.layers[0].keys[0, :, :n]
            values[r, :, :n] = cache.layers[0].values[0, :, :n]
    return keys, values


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
    past = max(lengths)
    width = max(1, max(0 if run is None else int(run[0].numel()) for run in runs))
    rows = len(drafters)
    hidden = torch.zeros(rows, width, first.head.config.hidden_size, device=device, dtype=dtype)
    token_ids = torch.zeros(rows, width, dtype=torch.long)
    positions = torch.zeros(rows, width, dtype=torch.long)
    allowed = torch.zeros(rows, width, past + width, dtype=torch.bool)
    visible = torch.zeros(rows, past + width, dtype=torch.bool)
    counts = []
    for r, (d, run, n) in enumerate(zip(drafters, runs, lengths)):
        count = 0 if run is None else int(run[0].numel())
        counts.append(count)
        if count:
            tokens, states = run
            hidden[r, :count] = d.head.input_hidden({k: v.to(device, dtype) for k, v in states.items()})
            token_ids[r, :count] = tokens
        positions[r] = n + torch.arange(width)
        allowed[r, :count, :n] = True
        allowed[r, :count, past: past + count] = torch.ones(count, count, dtype=torch.bool).tril_()
        pad = torch.arange(count, width)
        allowed[r, pad, past + pad] = True
        visible[r, :n] = True
        visible[r, past: past + count] = True
    cache = DynamicCache()
    stacked = _stacked_past([d._cache for d in drafters], lengths, hidden)
    if stacked:
        cache.update(*stacked, 0)
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
    keys, values = cache.layers[0].keys, cache.layers[0].values  # (B, kv_heads, P + W, head_dim)
    record = cache_key_positions(cache)  # (B, P + W) where the head records its keys' positions
    ran = [r for r, count in enumerate(counts) if count]
    if ran:
        last = torch.stack([out[r, counts[r] - 1] for r in ran])  # (m, h)
        with torch.no_grad():
            logits = first._logits_of(last)  # (m, Vd)
        for i, r in enumerate(ran):
            d, n, count = drafters[r], lengths[r], counts[r]
            own = DynamicCache()
            own.update(torch.cat([keys[r: r + 1, :, :n], keys[r: r + 1, :, past: past + count]], dim=2),
                       torch.cat([values[r: r + 1, :, :n], values[r: r + 1, :, past: past + count]], dim=2), 0)
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
    chains, requests = {}, {}
    for r, i in enumerate(open_rows):
        call = calls[i]
        chains[r] = group[r]._chain(call["k"], call.get("temperature", 0.0), call.get("generator"))
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
        hidden = torch.zeros(rows, 1, first.head.config.hidden_size, device=device, dtype=dtype)
        token_ids = torch.zeros(rows, 1, dtype=torch.long)
        positions = torch.zeros(rows, 1, dtype=torch.long)
        for r, (out, target_id, position) in requests.items():
            hidden[r, 0], token_ids[r, 0], positions[r, 0] = out, target_id[0], position
        # a stepping row sees its columns and its own earlier drafts, an idle one itself
        stepping = torch.zeros(rows, 1, dtype=torch.bool)
        stepping[list(requests)] = True
        visible = torch.cat([visible, torch.ones(rows, 1, dtype=torch.bool)], dim=1)  # (B, columns + 1)
        allowed = (visible & stepping) | (torch.arange(columns + 1) == columns)[None]  # (B, columns + 1)
        embeds = first.embed(token_ids.to(first.embed.weight.device)).to(device, dtype)
        with torch.no_grad():
            out = first.head(hidden, embeds, position_ids=positions.to(device),
                             attention_mask=additive(allowed[:, None].to(device), dtype), cache=cache)[:, 0]
            stepped = list(requests)
            logits = first._logits_of(out[stepped])  # (m, Vd)
        visible[:, -1] = stepping[:, 0]  # a drafted column is seen by its own row's later steps only
        share = (time.perf_counter() - start) / len(stepped)
        for m, r in enumerate(stepped):
            group[r].policy.record_step(share)
            try:
                requests[r] = chains[r].send((out[r], logits[m]))
            except StopIteration as done:
                drafts[open_rows[r]] = done.value
                del requests[r]
    return drafts
