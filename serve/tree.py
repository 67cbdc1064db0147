"""Draft trees: how they are specified, and the pure functions that turn one into attention masks and positions.

A tree is a list of nodes in topological order; `parents[i]` is the index of node i's parent, or -1 for
children of the pending token (the root, which the target also processes, at index 0 of the verify input).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TreeSpec:
    """How a drafter should grow its tree.

    static_choices: Medusa-style fixed tree, each entry a path of top-k ranks from the root, e.g.
        ((0,), (1,), (0, 0), (0, 1)) = the top-2 at depth 1, and the top-2 after the best at depth 2.
    Otherwise dynamic (EAGLE-2): expand `top_k` children per node for `depth` steps, then keep the
        `total_tokens` nodes of highest cumulative draft log-probability (always a valid subtree).
    """
    depth: int = 5
    top_k: int = 4
    total_tokens: int = 24
    static_choices: tuple[tuple[int, ...], ...] | None = None

    @property
    def is_static(self) -> bool:
        return self.static_choices is not None


def static_tree_parents(choices: tuple[tuple[int, ...], ...]) -> tuple[list[int], list[tuple[int, ...]]]:
    """Sort static choices into topological order; return (parents, sorted choices).

    Every prefix of a choice must itself be a choice (a valid tree).
    """
    ordered = sorted(set(tuple(c) for c in choices), key=lambda c: (len(c), c))
    index = {c: i for i, c in enumerate(ordered)}
    parents = []
    for c in ordered:
        if len(c) > 1 and c[:-1] not in index:
            raise ValueError(f"tree choice {c} has no parent {c[:-1]} in the tree")
        parents.append(index[c[:-1]] if len(c) > 1 else -1)
    return parents, ordered


def node_depths(parents: torch.Tensor) -> torch.Tensor:
    """parents: (n,) -> depth of each node (children of the root have depth 1)."""
    depths = torch.zeros_like(parents)
    for i, p in enumerate(parents.tolist()):
        depths[i] = 1 if p < 0 else depths[p] + 1
    return depths


def ancestor_mask(parents: torch.Tensor) -> torch.Tensor:
    """(n,) parents -> (n+1, n+1) bool: row i may attend to column j (root at 0, node i at i+1).

    Each node sees the root, its ancestors and itself.
    """
    n = parents.numel()
    mask = torch.zeros(n + 1, n + 1, dtype=torch.bool)
    mask[:, 0] = True
    for i, p in enumerate(parents.tolist()):
        row = i + 1
        if p >= 0:
            mask[row] = mask[p + 1]
        mask[row, row] = True
    return mask


def path_to(parents: torch.Tensor, node: int) -> list[int]:
    """Indices of nodes from the root's child down to `node` (inclusive); [] for node -1 (the root)."""
    path = []
    while node >= 0:
        path.append(node)
        node = int(parents[node])
    return path[::-1]


def add_chain(tokens: torch.Tensor, parents: torch.Tensor, chain: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Insert a chain below the root of a tree, sharing the nodes it agrees with; returns (tokens, parents).

    tokens, parents: (n,) a tree in topological order (a chain d1..dn is parents = [-1, 0, .., n-2]); chain: (m,).
    New nodes are appended after the existing ones, so the order stays topological."""
    tokens_out, parents_out = tokens.tolist(), parents.tolist()
    node = -1
    for token in chain.tolist():
        child = next((i for i, (t, p) in enumerate(zip(tokens_out, parents_out)) if p == node and t == token), None)
        if child is None:
            tokens_out.append(int(token))
            parents_out.append(node)
            child = len(tokens_out) - 1
        node = child
    return torch.tensor(tokens_out, dtype=torch.long), torch.tensor(parents_out, dtype=torch.long)


def chain_parents(n: int) -> torch.Tensor:
    """(n,) parents of a chain: each node the child of the one before, the first a child of the root."""
    return torch.arange(-1, n - 1, dtype=torch.long)
