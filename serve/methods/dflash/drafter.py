"""DFlash in the decoder: one forward of the head drafts a whole block.

The drafter keeps, per layer, the keys and values of the context: the fused target features of every position
the target has verified (computed once, when the head next drafts: committed positions are queued, as EAGLE's
are). A cycle runs the block [pending, m, ..., m] at the next positions against them; the block's own keys live
only in that forward, so nothing is rolled back. Every slot's distribution is known before any token is sampled:
the proposal is made as Medusa's (serve/drafters/positions_draft.py), chains or trees.
"""
from __future__ import annotations

import torch

from draftsmith.serve.core.target import Target
from draftsmith.serve.drafters.base import Draft, Drafter
from draftsmith.serve.drafters.draft_layer import shared_embedding
from draftsmith.serve.drafters.identity import check_target_identity
from draftsmith.serve.drafters.leaves import MAX_LEAVES, check_leaves
from draftsmith.serve.drafters.length import FixedLength, LastDraft, LengthPolicy, Stopwatch
from draftsmith.serve.drafters.positions_draft import propose_positions


class DFlashDrafter(Drafter):
    kind = "dflash"

    def __init__(self, head, target: Target, *, check: bool = True, policy: LengthPolicy | None = None,
                 leaves: int = MAX_LEAVES):
        self.head = head.eval().requires_grad_(False)
        self.config = head.config
        self.policy = policy or FixedLength()  # how many of a block's slots each chain drafts
        self.max_leaves = check_leaves(leaves)
        self.last = LastDraft()
        self.target = target
        self.target_layers = tuple(self.config.aux_layer_ids)
        if check:
            self.check_target(target)
        self.embed = shared_embedding(target)
        self.lm_head = target.model.get_output_embeddings()
        param = next(head.parameters())
        self.device, self.dtype = param.device, param.dtype
        self._reset()

    def _reset(self) -> None:
        self.n = 0  # context positions whose keys and values are kept
        self._context: list[tuple[torch.Tensor, torch.Tensor]] = []  # per layer (1, kv_heads, n, d)
        self._queued: list[dict[int, torch.Tensor]] = []  # committed features not yet run
        self._pending_token: int | None = None  # the last verified token: the block's first
        self._block_logits: torch.Tensor | None = None

    def check_target(self, target: Target) -> None:
        check_target_identity(self.config, target)

    def begin(self, prompt_ids, next_tokens, hidden_states) -> None:
        self._reset()
        self.last = LastDraft()
        self.policy.new_context()
        self._queue(next_tokens, hidden_states)

    def commit(self, next_tokens, hidden_states) -> None:
        self.last.settle(self.policy, next_tokens)
        self._queue(next_tokens, hidden_states)

    def _queue(self, next_tokens: torch.Tensor, hidden_states: dict[int, torch.Tensor]) -> None:
        self._queued.append({k: v for k, v in hidden_states.items() if k in self.target_layers})
        self._pending_token = int(next_tokens[-1])
        self._block_logits = None

    @torch.no_grad()
    def _catch_up(self) -> None:
        """The queued positions' keys and values, appended to the context's."""
        if not self._queued:
            return
        features = {k: torch.cat([q[k] for q in self._queued]).to(self.device, self.dtype)[None]
                    for k in self.target_layers}
        self._queued = []
        length = next(iter(features.values())).shape[1]
        positions = torch.arange(self.n, self.n + length, device=self.device)[None]
        new = self.head.context_kv(self.head.context(features), positions)
        self._context = new if not self._context else \
            [(torch.cat([k, nk], dim=2), torch.cat([v, nv], dim=2)) for (k, v), (nk, nv) in zip(self._context, new)]
        self.n += length

    @torch.no_grad()
    def _logits(self) -> torch.Tensor:
        """(block-1, V) float: the block's drafted slots, from one forward."""
        if self._block_logits is None:
            self._catch_up()
            block = self.config.block_size
            tokens = torch.full((block,), self.config.mask_token_id, dtype=torch.long)
            tokens[0] = self._pending_token
            embeds = self.embed(tokens.to(self.embed.weight.device)).to(self.device, self.dtype)[None]
            positions = torch.arange(self.n, self.n + block, device=self.device)[None]
            mask = torch.zeros(1, 1, block, self.n + block, dtype=self.dtype, device=self.device)  # sees everything
            out = self.head(embeds, positions, self._context, mask)[0, 1:]  # (block-1, h)
            self._block_logits = self.lm_head(out.to(self.lm_head.weight.dtype)).float()
        return self._block_logits

    def propose(self, k: int, *, temperature: float = 0.0, generator: torch.Generator | None = None,
                tree=None) -> Draft:
        if not self.last.open(self.policy, always=tree is not None):
            return Draft.empty()
        assert self._pending_token is not None, "begin() must run before propose()"
        with Stopwatch(self.policy.record_overhead):  # one forward drafts every slot
            logits = self._logits()
        return propose_positions(logits, k, policy=self.policy, last=self.last, max_leaves=self.max_leaves,
                                 to_target=lambda draft: draft.cpu(), d2t=None, vocab_size=self.config.vocab_size,
                                 temperature=temperature, generator=generator, tree=tree)
