"""Lossless verification of drafted tokens: pure functions over the target's distributions.

Chain with a sampled draft (q given): speculative sampling (Leviathan et al. 2023; Chen et al. 2023):
accept d_i with probability min(1, p_i(d_i) / q_i(d_i)); on rejection sample from max(0, p_i - q_i).
Deterministic drafts (q one-hot, every tree) use the multi-candidate form of SpecInfer (Miao et al. 2024)
with one-hot proposals: at a node, try its children in order; child c is accepted with probability
r(c) under the current residual r (initially p), and a rejected c is removed from r (r(c) = 0,
renormalized). This is exactly sampling from p, so the output distribution equals the target's; at
temperature 0 (p one-hot) it reduces to "follow the child that equals the argmax": `verify_greedy`, which reads the
argmax of each row instead of a one-hot over the vocabulary (what greedy decoding runs; the same verdicts).
A seeded request follows the same walk with the target's own seeded token per row in place of the argmax
(`verify_keyed`, serve/core/noise.py): the tokens of plain seeded decoding, drawn from p at every position.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from draftsmith.serve.core.sampling import residual, sample


@dataclass
class Verdict:
    accepted: list[int]  # draft node indices accepted, root to leaf (a chain: 0..m-1)
    next_token: int  # the correction or bonus token sampled after them


def verify_chain(tokens: torch.Tensor, p: torch.Tensor, q: torch.Tensor | None,
                 generator: torch.Generator | None) -> Verdict:
    """tokens: (k,) drafts; p: (k+1, V) target distributions after [pending, d1..dk]; q: (k, V) or None."""
    if q is None:
        parents = torch.arange(-1, tokens.numel() - 1)
        return verify_tree(tokens, parents, p, generator)
    for i, token in enumerate(tokens.tolist()):
        p_i, q_i = p[i], q[i]
        ratio = p_i[token] / q_i[token] if q_i[token] > 0 else torch.tensor(0.0)
        if torch.rand((), generator=generator) < ratio:
            continue
        return Verdict(list(range(i)), sample(residual(p_i, q_i), generator))
    return Verdict(list(range(tokens.numel())), sample(p[-1], generator))


def verify_tree(tokens: torch.Tensor, parents: torch.Tensor, p: torch.Tensor,
                generator: torch.Generator | None) -> Verdict:
    """tokens, parents: (n,) a tree in topological order; p: (n+1, V), row 0 = the root (pending token),
    row i+1 = after node i. Deterministic proposals (q one-hot)."""
    children = _children(parents)
    node, path = -1, []
    while True:
        r = p[node + 1].clone()
        moved = False
        for child in children.get(node, []):
            token = int(tokens[child])
            mass = float(r[token])
            if mass <= 0:
                continue
            if mass >= 1 or torch.rand((), generator=generator) < mass:
                node, moved = child, True
                path.append(child)
                break
            r[token] = 0  # rejected: remove it from the residual
            r = r / r.sum()
        if not moved:
            return Verdict(path, sample(r, generator))


def verify_greedy(tokens: torch.Tensor, parents: torch.Tensor | None, best: torch.Tensor) -> Verdict:
    """Temperature 0: tokens (n,) drafts, parents (n,) a tree in topological order or None for a chain; best (n+1,)
    the target's argmax after the root (pending token, row 0) and after each node (row i+1). From the root, follow
    the first child whose token is the argmax; the verdict's next token is the argmax after the last node kept."""
    argmax = best.tolist()
    return verify_keyed(tokens, parents, lambda row, depth: argmax[row])


def verify_keyed(tokens: torch.Tensor, parents: torch.Tensor | None, token_at: Callable[[int, int], int]) -> Verdict:
    """From the root, follow the first child whose token is the target's own token at that node, token_at(row,
    depth) (row 0 the root, row i+1 node i; depth 0 at the root); the verdict's next token is the target's token
    after the last node kept. Only the rows on the path are asked. A seeded request (serve/core/noise.py) reads its
    tokens here, drawn with the noise of output position depth past the cycle's first: the tokens kept are plain
    seeded decoding's, whatever was drafted."""
    drafted = tokens.tolist()
    children = _children(parents if parents is not None else torch.arange(-1, tokens.numel() - 1))
    node, path = -1, []
    while True:
        own = token_at(node + 1, len(path))
        child = next((c for c in children.get(node, []) if drafted[c] == own), None)
        if child is None:
            return Verdict(path, own)
        node = child
        path.append(child)


def _children(parents: torch.Tensor) -> dict[int, list[int]]:
    """parents (n,) -> node -> its children in order (-1: the root)."""
    children: dict[int, list[int]] = {}
    for i, parent in enumerate(parents.tolist()):
        children.setdefault(parent, []).append(i)
    return children
