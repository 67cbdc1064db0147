"""Leaves: a greedy chain's runner-up drafts, verified in the same target forward as the chain.

A chain d_1..d_n drafted from the head's distributions q_1..q_n leaves their second, third, ... most likely tokens
unused. Hung off the chain as leaves (the rank-r token of q_i a child of d_{i-1}), they turn a rejection at
position i into one more token whenever the target's token there is one of them: the leaf is accepted, and the
target's row for it yields the bonus. A leaf costs no draft step (q_i is already computed), only one more row in
the verify forward, which on hardware where a forward over a few more tokens costs about the same (a GPU, or a
CPU running packed weights, serve/core/packed.py) is nearly free. So the policy adds leaves while the expected rate
E/C of the cycle improves, with

    gain of leaf (i, r) = P_{i-1} · (1 - a_i) · b_{i,r},   P_{i-1} = a_1·...·a_{i-1},

b_{i,r} = P(the target's token at i is the rank-r token | it is not d_i), calibrated from the leaves' own
verifications, with q_i(rank r) / (1 - q_i(d_i)) as the prior. This is the first step of EAGLE-2's dynamic tree
(https://arxiv.org/abs/2406.16858) without its extra draft steps: every node beyond the chain is a leaf.

A tree of deterministic proposals verifies exactly (serve/verify.py), at any temperature; leaves are only hung
on greedy chains, whose tokens are the argmax (a sampled chain is verified against its q). EAGLE heads (each
position's distribution read from the head's own previous draft) and Medusa heads (one head per position) both
hang them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Hashable, Sequence

import torch

from draftsmith.serve.drafters.base import Draft
from draftsmith.serve.tree import chain_parents

LEAF_BINS = 10
LEAF_RANKS = 3  # runner-ups looked at (and learned from) per drafted position
MAX_LEAVES = 8  # at most this many hung on one chain, by default (the length policy chooses how many pay)


def check_leaves(leaves: int) -> int:
    if leaves < 0:
        raise ValueError(f"leaves must be >= 0, got {leaves}")
    return int(leaves)


@dataclass(frozen=True)
class Leaf:
    depth: int  # 1-based position in the chain it is an alternative for
    rank: int  # 1 = the runner-up of q_depth
    token: int  # draft id
    key: Hashable  # calibration key
    prior: float  # b before any evidence


def leaves_of(top_probs: Sequence[float], top_ids: Sequence[int], depth: int) -> list[Leaf]:
    """A chain position's most likely tokens (probabilities at temperature 1, draft ids), best first -> the ones
    after the top-1 as candidate leaves. Calibrated per rank and probability bin (the first position apart from
    later ones)."""
    rest = max(1e-6, 1.0 - top_probs[0])
    out = []
    for rank in range(1, len(top_probs)):
        prior = min(1.0, top_probs[rank] / rest)
        key = ("leaf", min(depth - 1, 1), min(rank, 2), min(int(prior * LEAF_BINS), LEAF_BINS - 1))
        out.append(Leaf(depth=depth, rank=rank, token=top_ids[rank], key=key, prior=prior))
    return out


def leaf_gains(accept: Sequence[float], leaf_accept: Sequence[tuple[int, float]]) -> list[float]:
    """accept: the chain's a_1..a_n; leaf_accept: (depth, b) per leaf -> each leaf's expected extra tokens.

    Leaves of one depth are exclusive (at most one equals the target's token), so their b's are scaled to sum to
    at most 1."""
    reach = [1.0]
    for a in accept:
        reach.append(reach[-1] * a)
    per_depth: dict[int, float] = {}
    for depth, b in leaf_accept:
        per_depth[depth] = per_depth.get(depth, 0.0) + b
    gains = []
    for depth, b in leaf_accept:
        scale = 1.0 / per_depth[depth] if per_depth[depth] > 1.0 else 1.0
        gains.append(reach[depth - 1] * (1.0 - accept[depth - 1]) * b * scale)
    return gains


def choose_leaves(tokens: float, nodes: int, gains: Sequence[float], cost: Callable[[int], float],
                  *, limit: int) -> list[int]:
    """Which leaves to add: the `j` most valuable, for the j <= limit with the best expected rate of the cycle
    (ties: fewer). The rate is judged over every j, not leaf by leaf: a verify cost that steps up at some width
    and then stays flat can make three leaves pay where one does not.

    tokens: the chain's expected tokens E(n); nodes: its drafted tokens n; gains: each candidate's expected extra
    tokens; cost(m): the cycle's cost when the verify forward holds m drafted nodes. Returns indices into
    `gains`, best first."""
    order = [i for i in sorted(range(len(gains)), key=lambda i: -gains[i]) if gains[i] > 0][:limit]
    best, best_rate = 0, tokens / cost(nodes)
    for j, i in enumerate(order, start=1):
        tokens += gains[i]
        rate = tokens / cost(nodes + j)
        if rate > best_rate:
            best, best_rate = j, rate
    return order[:best]


def leaf_tree(chain: Sequence[int], leaves: Sequence[Leaf]) -> tuple[list[int], list[int]]:
    """The chain d_1..d_n (parents -1, 0, .., n-2), then each leaf as a child of d_{depth-1} (the root for depth
    1) -> (tokens, parents) in topological order."""
    tokens = list(chain)
    parents = chain_parents(len(chain)).tolist()
    for leaf in leaves:
        tokens.append(leaf.token)
        parents.append(leaf.depth - 2)
    return tokens, parents


def hang_leaves(chain: torch.Tensor, candidates: Sequence[Leaf], policy, last, *, limit: int,
                to_target: Callable[[torch.Tensor], torch.Tensor]) -> Draft:
    """chain: (n,) the greedy chain's target ids; candidates: runner-ups in draft ids. Every candidate is recorded on
    `last` (a LastDraft: all of them are learned from, hung or not); returns the chain with the leaves `policy`
    chose as a tree, or the plain chain."""
    if not candidates:
        return Draft(tokens=chain)
    ids = to_target(torch.tensor([c.token for c in candidates], dtype=torch.long)).tolist()
    candidates = [Leaf(c.depth, c.rank, t, c.key, c.prior) for c, t in zip(candidates, ids)]
    last.leaves = candidates
    chosen = policy.leaves(candidates, limit=limit)
    if not chosen:
        return Draft(tokens=chain)
    tokens, parents = leaf_tree(chain.tolist(), chosen)
    return Draft(tokens=torch.tensor(tokens, dtype=torch.long), parents=torch.tensor(parents, dtype=torch.long))
