"""The oracle drafter: proposes the target's own greedy continuation, precomputed, so every draft is accepted at
temperature 0. It measures the decoder's overhead alone (the speedup limit a perfect drafter would get)."""
from __future__ import annotations

from typing import Any, Callable, ClassVar

import torch

from draftsmith.serve.drafters.base import Draft, Drafter
from draftsmith.serve.core.target import Target


class OracleDrafter(Drafter):
    kind: ClassVar[str] = "oracle"
    shared_state: ClassVar[tuple[str, ...]] = ("_continuations",)  # prepared once for every row of a batch

    def __init__(self, target: Target, *, generate: Callable[..., Any], max_new_tokens: int = 512):
        """generate: the plain decoder (serve.decoding.plain_generate), handed in by build_drafter so that the
        oracle, like every drafter, stays below the decoder instead of importing it."""
        self.target, self.generate, self.max_new_tokens = target, generate, max_new_tokens
        self._continuations: dict[tuple[int, ...], torch.Tensor] = {}
        self.continuation = torch.empty(0, dtype=torch.long)
        self.produced = 0

    def prepare(self, prompt_ids: torch.Tensor) -> None:
        """Precompute the greedy continuation of a (T,) prompt, so that timing a generation excludes it."""
        key = tuple(prompt_ids.tolist())
        if key not in self._continuations:
            result = self.generate(self.target, prompt_ids[None], max_new_tokens=self.max_new_tokens, eos_token_ids=())
            self._continuations[key] = torch.tensor(result.output_ids, dtype=torch.long)

    def begin(self, prompt_ids, next_tokens, hidden_states) -> None:
        self.prepare(prompt_ids)
        self.continuation = self._continuations[tuple(prompt_ids.tolist())]
        self.produced = 1

    def commit(self, next_tokens, hidden_states) -> None:
        self.produced += int(next_tokens.numel())

    def propose(self, k, *, temperature=0.0, generator=None, tree=None) -> Draft:
        return Draft(self.continuation[self.produced: self.produced + k].clone())
