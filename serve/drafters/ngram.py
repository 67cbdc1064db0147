"""Prompt lookup (n-gram) drafting: propose what followed the latest earlier occurrence of the current suffix."""
from __future__ import annotations

from typing import ClassVar

import torch

from serve.drafters.base import Draft, Drafter


def lookup(tokens: torch.Tensor, *, k: int, max_n: int, min_n: int) -> torch.Tensor:
    """tokens: (L,) the sequence so far -> up to k tokens that followed the most recent earlier match of its
    last n tokens, trying n = max_n down to min_n. Empty when nothing matches."""
    length = tokens.numel()
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        suffix = tokens[length - n:]
        windows = tokens[: length - 1].unfold(0, n, 1)  # (L-n, n): every earlier n-gram that has a successor
        hits = (windows == suffix).all(dim=1).nonzero().flatten()
        if hits.numel():
            start = int(hits[-1]) + n
            return tokens[start: start + k]
    return tokens[:0]


class NgramDrafter(Drafter):
    kind: ClassVar[str] = "ngram"

    # min_n=2: a single-token match drafts too often on free text, where each rejected verify costs ~1.6x a step
    # on CPU (measured: free writing 0.85x with min_n=1, 0.96x with min_n=2; code editing unchanged).
    def __init__(self, *, max_n: int = 4, min_n: int = 2):
        if not 1 <= min_n <= max_n:
            raise ValueError(f"ngram needs 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
        self.max_n, self.min_n = max_n, min_n
        self.tokens = torch.empty(0, dtype=torch.long)

    def begin(self, prompt_ids, next_tokens, hidden_states) -> None:
        self.tokens = torch.cat([prompt_ids[:1], next_tokens]).long()

    def commit(self, next_tokens, hidden_states) -> None:
        self.tokens = torch.cat([self.tokens, next_tokens.long()])

    def propose(self, k, *, temperature=0.0, generator=None, tree=None) -> Draft:
        return Draft(lookup(self.tokens, k=k, max_n=self.max_n, min_n=self.min_n).clone())
