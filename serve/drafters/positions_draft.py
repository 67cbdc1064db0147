"""A proposal from drafters whose every position's distribution is known in one forward, before any token is
sampled: Medusa's heads (head i drafts the token i+1 places on) and DFlash's block (slot i drafts x_{a+i}).

The length is chosen from all positions' confidences at once (LengthPolicy.choose); a sampled chain draws each
token from its own position's distribution, which it is verified against, so it stays exact; a tree takes
position d's distribution for every node at depth d."""
from __future__ import annotations

from typing import Callable

import torch

from draftsmith.serve.drafters.base import Draft
from draftsmith.serve.drafters.heads_common import grow_tree, read_positions, sample_chain_token
from draftsmith.serve.drafters.leaves import LEAF_RANKS, hang_leaves, leaves_of
from draftsmith.serve.drafters.length import LastDraft, LengthPolicy


def propose_positions(logits: torch.Tensor, k: int, *, policy: LengthPolicy, last: LastDraft, max_leaves: int,
                      to_target: Callable[[torch.Tensor], torch.Tensor], d2t: torch.Tensor | None, vocab_size: int,
                      temperature: float = 0.0, generator: torch.Generator | None = None, tree=None) -> Draft:
    """logits: (n, Vd) float, position i's draft distribution (i = 0 drafts the token after the pending one);
    to_target: draft ids -> target ids (on CPU)."""
    n_positions = logits.shape[0]
    logprobs = torch.log_softmax(logits, dim=-1)
    if tree is not None:
        tokens, parents = grow_tree(logprobs[0], lambda nodes, depth, *_: logprobs[depth].expand(len(nodes), -1),
                                    tree, max_depth=n_positions)
        return Draft(tokens=to_target(tokens), parents=parents)
    policy.start(min(k, n_positions), sampled=temperature > 0)
    readings = read_positions(logits, LEAF_RANKS)  # every position's signal, greedy token and runner-ups at once
    n = policy.choose([reading.confidence(i) for i, reading in enumerate(readings)])
    tokens, qs = [], []
    for i in range(n):
        token, q = sample_chain_token(logits[i], temperature=temperature, generator=generator, d2t=d2t,
                                      vocab_size=vocab_size, reading=readings[i])
        tokens.append(token)
        if q is not None:
            qs.append(q)
    ids = to_target(torch.tensor(tokens, dtype=torch.long))
    # greedy: every position's draft is known, drafted or not, and is learned from
    seen = ids if temperature > 0 else to_target(torch.tensor([r.argmax for r in readings[: policy.cap]]))
    last.tokens = seen.tolist()
    if temperature <= 0:
        candidates = [leaf for i in range(n) for leaf in leaves_of(readings[i].top_probs, readings[i].top_ids, i + 1)
                      ] if max_leaves else []
        return hang_leaves(ids, candidates, policy, last, limit=max_leaves, to_target=to_target)
    return Draft(tokens=ids, q=torch.stack(qs).cpu() if qs else None)
