"""How wide one batched verify forward is: every row's drafts are padded to the widest row's, so the forward costs
V(W, B) / V(0, B) plain steps whatever the other rows drafted (serve/batch/costs.py measures exactly that). One
row's long draft makes every row pay for it; the batch keeps the width whose expected tokens per cost is best.

Each row's drafter proposes as its length policy decides at this batch size; a row whose drafter says how likely
each of its chain tokens is to be accepted (Drafter.chain_acceptance) can then be cut back to the batch's width
(dropping a chain's tail or its leaves keeps verification exact: the cut tokens are simply not proposed). Rows
that say nothing (a fixed length, a tree, the oracle) keep their drafts and set the least width.
"""
from __future__ import annotations

from typing import Callable, Sequence

from draftsmith.serve.drafters.base import Draft
from draftsmith.serve.drafters.length_model import expected_tokens


def batch_width(nodes: Sequence[int], chains: Sequence[Sequence[float] | None],
                ratio: Callable[[int], float]) -> int:
    """nodes[r]: row r's draft size; chains[r]: its chain tokens' acceptance probabilities (None: it cannot be cut)
    -> the most draft nodes a row keeps, the one with the best expected tokens per verify cost (ties: narrower).

    A row cut to w keeps its first min(w, chain) chain tokens; ratio(w): the cost of a forward w drafts wide."""
    floor = max((n for n, c in zip(nodes, chains) if c is None), default=0)
    best, best_rate = floor, float("-inf")
    for width in range(floor, max(nodes, default=0) + 1):
        tokens = 0.0
        for n, chain in zip(nodes, chains):
            if chain is None:
                tokens += 1.0  # unknown acceptance: counted as its bonus token alone, the same at every width
            else:
                kept = len(chain) if n <= width else min(len(chain), width)
                tokens += expected_tokens(chain[:kept])[-1]
        rate = tokens / ratio(width)
        if rate > best_rate + 1e-12:
            best, best_rate = width, rate
    return best


def cut(draft: Draft, chain: int, width: int) -> Draft:
    """A draft of `chain` chain tokens (then leaves, if a tree) cut to at most `width` nodes: its first chain tokens."""
    if len(draft) <= width:
        return draft
    keep = min(chain, width)
    return Draft(tokens=draft.tokens[:keep].clone(), q=draft.q[:keep] if draft.q is not None else None)
