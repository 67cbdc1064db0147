"""The inputs of one batched verify forward: per-row tokens, positions and the attention mask over the slot cache.

Row r holds `lengths[r]` tokens at cache columns [0, lengths[r]) (serve/core/slots.py) and writes W new ones at
columns lengths[r] + j: its pending token (j = 0), its n_r drafts (j = 1..n_r, a chain or a tree) and padding up
to the batch's widest row. A real query sees the row's cached columns and its own ancestors in the draft; a
padding query sees itself only (no softmax row is empty, and nothing real reads it). Positions are explicit per
row, so a row's rejected columns from earlier cycles, masked and then overwritten, never shift its positions.
"""
from __future__ import annotations

from typing import Sequence

import torch

from draftsmith.serve.drafters.base import Draft
from draftsmith.serve.tree import ancestor_mask, chain_parents, node_depths


def draft_block(draft: Draft) -> tuple[torch.Tensor, torch.Tensor]:
    """A draft of n nodes -> (depths (n+1,) long, pending first at 0; visible (n+1, n+1) bool, ancestors and self)."""
    parents = draft.parents.cpu() if draft.is_tree else chain_parents(len(draft))
    depths = torch.cat([torch.zeros(1, dtype=torch.long), node_depths(parents)])
    return depths, ancestor_mask(parents)


def verify_inputs(pending: Sequence[int], drafts: Sequence[Draft], lengths: torch.Tensor, *, pad_id: int
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """pending: A tokens; drafts: A drafts; lengths: (A,) long cached tokens per row ->
    input_ids (A, W), query positions (A, W), key positions (A, window), allowed (A, 1, W, window) bool,
    with W = 1 + the longest draft and window = max(lengths) + W (the cache columns the forward attends to)."""
    rows = len(drafts)
    width = 1 + max((len(d) for d in drafts), default=0)
    window = int(lengths.max()) + width
    columns = torch.arange(window)
    if width == 1:  # no row drafts (self-distillation, plain batched decoding): each reads its pending token alone
        input_ids = torch.tensor(list(pending), dtype=torch.long)[:, None]  # (A, 1)
        allowed = columns[None, None, :] <= lengths[:, None, None]  # (A, 1, window): its cached columns and itself
        return input_ids, lengths[:, None].clone(), columns[None, :].repeat(rows, 1), allowed[:, None]
    input_ids = torch.full((rows, width), pad_id, dtype=torch.long)
    query_positions = lengths[:, None] + torch.arange(width)[None, :]  # padding: past the row's tokens
    key_positions = columns[None, :].repeat(rows, 1)  # (A, window): a cached column's position is its index
    allowed = torch.zeros(rows, width, window, dtype=torch.bool)
    for r, draft in enumerate(drafts):
        length, n = int(lengths[r]), len(draft)
        input_ids[r, 0] = pending[r]
        input_ids[r, 1: n + 1] = draft.tokens.cpu()
        depths, visible = draft_block(draft)
        query_positions[r, : n + 1] = length + depths
        key_positions[r, length: length + width] = query_positions[r]
        allowed[r, : n + 1, :length] = True
        allowed[r, : n + 1, length: length + n + 1] = visible
        pad = torch.arange(n + 1, width)
        allowed[r, pad, length + pad] = True
    return input_ids, query_positions, key_positions, allowed[:, None]
