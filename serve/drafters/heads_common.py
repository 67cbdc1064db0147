"""Drafting with trained heads (EAGLE-1, EAGLE-3, Medusa): the signal a draft-length policy reads (when a
chain keeps going), how a chain token is sampled, and how a draft tree grows."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from draftsmith.serve.drafters.length import Signal
from draftsmith.serve.drafters.vocab import draft_token_ids, full_vocab_probs
from draftsmith.serve.core.sampling import sample

CONFIDENCE_BINS = 10


def confidence_signal(logits: torch.Tensor, group: int) -> Signal:
    """The draft's top-1 probability (at temperature 1) as a length-policy signal, known before sampling.

    Calibrated per probability bin within `group` (EAGLE: the first drafted position apart from later ones,
    which read the head's own drafts; Medusa: per head); the raw probability is the prior. Stopping a chain
    early never changes the output distribution (each position is still verified exactly); it saves the verify
    cost of drafts that would likely be rejected."""
    return confidence_of(float(torch.softmax(logits.float(), dim=-1).max()), group)


def confidence_of(top: float, group: int) -> Signal:
    """A draft's top-1 probability -> its `confidence_signal`."""
    return ("confidence", group, min(int(top * CONFIDENCE_BINS), CONFIDENCE_BINS - 1)), top


@dataclass(frozen=True)
class Reading:
    """What a chain reads of one position's draft distribution (its logits (Vd,)) before it decides: the greedy
    token, and the most likely tokens at temperature 1 with their probabilities, best first (the top-1 probability
    is the length policy's signal, the others the runner-ups a greedy chain may hang as leaves)."""
    argmax: int  # draft id
    top_probs: list[float]
    top_ids: list[int]  # draft ids

    def confidence(self, group: int) -> Signal:
        """`confidence_signal` of these logits."""
        return confidence_of(self.top_probs[0], group)


def read_positions(logits: torch.Tensor, ranks: int) -> list[Reading]:
    """logits (m, Vd) -> a Reading per row with its `ranks` + 1 most likely tokens, from one softmax, one top-k and
    one argmax for all rows: a batch's chains read their positions together, where each chain's own softmaxes,
    argmax and top-k were a dozen small ops a row and step. A row's values are the ones its own (Vd,) logits
    give."""
    logits = logits.float()
    top = torch.topk(torch.softmax(logits, dim=-1), min(ranks + 1, logits.shape[-1]), dim=-1)
    best = torch.argmax(logits, dim=-1).tolist()
    return [Reading(b, p, i) for b, p, i in zip(best, top.values.tolist(), top.indices.tolist())]


def sample_chain_token(logits: torch.Tensor, *, temperature: float, generator: torch.Generator | None,
                       d2t: torch.Tensor | None, vocab_size: int, reading: Reading | None = None
                       ) -> tuple[int, torch.Tensor | None]:
    """logits: (Vd,) -> (draft id, q over the full target vocabulary or None when greedy). Greedy takes the argmax
    `reading` already holds (read_positions), where the caller read the logits."""
    if temperature <= 0:
        return (reading.argmax if reading is not None else int(torch.argmax(logits))), None
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if hasattr(generator, "draw"):  # a seeded request: the noise of the target's own token (serve/core/noise.py)
        token = generator.draw(probs.cpu(), vocab_size, draft_token_ids(d2t) if d2t is not None else None)
    else:
        token = sample(probs.cpu(), generator)
    return token, full_vocab_probs(probs, d2t, vocab_size)


def grow_tree(root_logprobs: torch.Tensor, expand, spec, *, max_depth: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Grow a draft tree; returns (tokens (n,) draft ids, parents (n,)) in topological order.

    root_logprobs: (Vd,) distribution of the first draft token. `expand(nodes, depth, tokens, parents)` returns
    (len(nodes), Vd) log-probabilities of the children of `nodes` (indices into the growing tokens/parents
    lists, all at `depth`, 1-based). Static specs take the listed top-k ranks; dynamic ones (EAGLE-2) keep
    the `top_k` best by cumulative log-prob at each depth and return the `total_tokens` best overall.
    """
    tokens: list[int] = []
    parents: list[int] = []
    if spec.is_static:
        from draftsmith.serve.tree import static_tree_parents

        choices = tuple(c for c in spec.static_choices if len(c) <= max_depth)
        tree_parents, ordered = static_tree_parents(choices)
        dist: dict[int, torch.Tensor] = {-1: root_logprobs}
        for depth in range(1, max(len(c) for c in ordered) + 1):
            level = [i for i, c in enumerate(ordered) if len(c) == depth]
            for i in level:
                ranks = torch.topk(dist[tree_parents[i]], ordered[i][-1] + 1).indices
                tokens.append(int(ranks[-1]))
                parents.append(tree_parents[i])
            expandable = [i for i in level if any(p == i for p in tree_parents)]
            if expandable:
                rows = expand(expandable, depth, tokens, parents)
                dist.update({i: rows[j] for j, i in enumerate(expandable)})
        return torch.tensor(tokens, dtype=torch.long), torch.tensor(parents, dtype=torch.long)

    scores: list[float] = []
    depths: list[int] = []
    top = torch.topk(root_logprobs, min(spec.top_k, root_logprobs.numel()))
    frontier = []
    for lp, tok in zip(top.values.tolist(), top.indices.tolist()):
        frontier.append(len(tokens))
        tokens.append(tok), parents.append(-1), scores.append(lp), depths.append(1)
    for depth in range(1, min(spec.depth, max_depth)):
        rows = expand(frontier, depth, tokens, parents)  # (n_f, Vd)
        child = torch.topk(rows, min(spec.top_k, rows.shape[-1]), dim=-1)
        base = torch.tensor([scores[i] for i in frontier], dtype=rows.dtype, device=rows.device)
        cumulative = (base[:, None] + child.values).flatten()  # (n_f * top_k,)
        new = []
        for flat, score in enumerate(cumulative.tolist()):
            f, r = divmod(flat, child.values.shape[1])
            new.append(len(tokens))
            tokens.append(int(child.indices[f, r])), parents.append(frontier[f])
            scores.append(score), depths.append(depth + 1)
        best = torch.topk(cumulative, min(spec.top_k, cumulative.numel())).indices.tolist()
        frontier = [new[b] for b in sorted(best)]
    # The best nodes by cumulative log-prob; a parent always outranks its child (log-probs <= 0, then depth).
    order = sorted(range(len(tokens)), key=lambda i: (-scores[i], depths[i], i))[: spec.total_tokens]
    keep = sorted(order, key=lambda i: (depths[i], i))  # topological: parents first
    remap = {old: new for new, old in enumerate(keep)}
    out_parents = [remap[parents[i]] if parents[i] >= 0 else -1 for i in keep]
    return (torch.tensor([tokens[i] for i in keep], dtype=torch.long),
            torch.tensor(out_parents, dtype=torch.long))
