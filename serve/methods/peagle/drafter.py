"""P-EAGLE in the decoder: one forward of the head drafts every depth.

The committed pairs the head has not run yet and K-1 mask slots after them go through the head together (vLLM's
parallel drafting does the same); the slots' cache entries are dropped when the next cycle catches up, as an EAGLE
chain's are. Every depth's distribution is known before any token is sampled: the proposal is made as Medusa's and
DFlash's (serve/drafters/positions_draft.py), chains or trees.
"""
from __future__ import annotations

import torch

from draftsmith.serve.core.kv import rollback
from draftsmith.serve.drafters.base import Draft
from draftsmith.serve.drafters.eagle_drafter import EagleDrafter
from draftsmith.serve.drafters.length import Stopwatch
from draftsmith.serve.drafters.masks import causal_allowed
from draftsmith.serve.drafters.positions_draft import propose_positions


class PEagleDrafter(EagleDrafter):

    @torch.no_grad()
    def _depth_logits(self, depths: int) -> torch.Tensor:
        """(depths, Vd) float: depth 0 from the last real pair, depths 1.. from mask slots, in one forward."""
        rollback(self._cache, self.n)
        slots = depths - 1
        pending = self._take_pending()
        if pending is not None:
            tokens, features = pending
            real = self.head.input_hidden({k: v.to(self.device, self.dtype) for k, v in features.items()})  # (L, h)
        else:
            tokens, real = torch.zeros(0, dtype=torch.long), torch.zeros(0, self.config.hidden_size)
        length = int(tokens.numel())
        hidden = torch.cat([real.to(self.device, self.dtype),
                            self.head.mask_input().to(self.dtype).expand(slots, -1)])
        tokens = torch.cat([tokens, torch.full((slots,), self.config.mask_token_id, dtype=torch.long)])
        out = self._run(hidden, tokens, torch.arange(self.n, self.n + length + slots),
                        causal_allowed(length + slots, self.n))
        if length:
            self.n += length
            self._last_out = out[length - 1]
            self._last_logits = self._logits_of(out[length - 1: length])[0]
        return torch.cat([self._last_logits[None], self._logits_of(out[length:])])

    def propose(self, k: int, *, temperature: float = 0.0, generator: torch.Generator | None = None,
                tree=None) -> Draft:
        if not self.last.open(self.policy, always=tree is not None):
            return Draft.empty()
        assert self._last_logits is not None or self._pending, "begin() must run before propose()"
        trained = self.config.num_speculative_tokens
        with Stopwatch(self.policy.record_overhead):  # one forward drafts every depth
            logits = self._depth_logits(trained if tree is not None else max(1, min(k, trained)))
        return propose_positions(logits, k, policy=self.policy, last=self.last, max_leaves=self.max_leaves,
                                 to_target=self._to_target, d2t=self.d2t, vocab_size=self.config.vocab_size,
                                 temperature=temperature, generator=generator, tree=tree)
