"""The drafting runtime shared by EAGLE-1 and EAGLE-3 heads: own KV cache, chains and EAGLE-2 dynamic trees.

The head's cache holds one entry per (feature t, token t+1) pair it has run, computed from the target's real
features; `_last_out`/`_last_logits` belong to the last one, whose next token is the pending one. Committed
pairs are queued and run lazily, in one forward when the head next drafts (or its cache or logits are read):
cycles that do not draft (the length policy found it not worth it, or a hybrid used its n-gram side) cost
nothing. Proposals append entries for the head's own drafted pairs; the next catch-up crops them.
"""
from __future__ import annotations

import torch
from transformers import DynamicCache

from draftsmith.serve.drafters.base import Draft, Drafter
from draftsmith.serve.drafters.draft_layer import shared_embedding
from draftsmith.serve.drafters.heads_common import Reading, grow_tree, read_positions, sample_chain_token
from draftsmith.serve.drafters.identity import check_target_identity
from draftsmith.serve.drafters.leaves import LEAF_RANKS, MAX_LEAVES, check_leaves, hang_leaves, leaves_of
from draftsmith.serve.drafters.length import FixedLength, LastDraft, LengthPolicy, Stopwatch
from draftsmith.serve.drafters.masks import additive, causal_allowed
from draftsmith.serve.core.kv import head_cache, rollback
from draftsmith.serve.core.target import Target


class EagleDrafter(Drafter):
    """Drives an Eagle1Head or Eagle3Head against a target (embeddings and, for EAGLE-1, lm_head from it)."""

    def __init__(self, head, target: Target, *, check: bool = True, policy: LengthPolicy | None = None,
                 leaves: int = MAX_LEAVES):
        self.head = head.eval().requires_grad_(False)
        self.policy = policy or FixedLength()  # how many tokens each chain drafts
        self.max_leaves = check_leaves(leaves)  # at most this many runner-ups a greedy chain carries
        self.last = LastDraft()  # the last chain proposed, until its verification is known
        self.target = target
        self.config = head.config
        self.kind = self.config.method
        self.target_layers = tuple(self.config.aux_layer_ids)
        if check:
            self.check_target(target)
        self.embed = shared_embedding(target)  # what the engines share with the draft (Gemma: unscaled)
        self.lm_head = target.model.get_output_embeddings() if getattr(head, "reads_target_lm_head", False) else None
        # what the target's lm_head reads of an output (an MTP layer's shared-head norm), the output itself else
        self._lm_head_input = getattr(head, "lm_head_input", None) or (lambda out: out)
        param = next(head.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.d2t = getattr(head, "d2t", None)
        self._cache = head_cache(head)
        self.n = 0
        self._pending: list[tuple[torch.Tensor, dict[int, torch.Tensor]]] = []  # committed, not yet run
        self._last_out: torch.Tensor | None = None  # (h,)
        self._last_logits: torch.Tensor | None = None  # (Vd,)

    @property
    def min_confidence(self) -> float:
        return float(getattr(self.policy, "threshold", 0.0))

    def check_target(self, target: Target) -> None:
        check_target_identity(self.config, target)

    # ---------------------------------------------------------------------------------------- forward
    def _logits_of(self, out: torch.Tensor) -> torch.Tensor:
        """(L, h) -> (L, Vd) float."""
        if self.lm_head is not None:
            return self.lm_head(self._lm_head_input(out).to(self.lm_head.weight.dtype)).float()
        return self.head.logits(out).float()

    @torch.no_grad()
    def _run(self, hidden_in: torch.Tensor, token_ids: torch.Tensor, positions: torch.Tensor,
             allowed: torch.Tensor) -> torch.Tensor:
        """hidden_in: (L, h); token_ids, positions: (L,); allowed: (L, cache_len + L) bool -> out (L, h)."""
        embeds = self.embed(token_ids.to(self.embed.weight.device)).to(self.device, self.dtype)
        out = self.head(hidden_in.to(self.device, self.dtype)[None], embeds[None],
                        position_ids=positions.to(self.device)[None],
                        attention_mask=additive(allowed.to(self.device), self.dtype)[None], cache=self._cache)
        return out[0]

    def _consume(self, next_tokens: torch.Tensor, hidden_states: dict[int, torch.Tensor]) -> None:
        """Append real pairs (features from the target) at positions n.. and keep the last output."""
        hidden_in = self.head.input_hidden({k: v.to(self.device, self.dtype) for k, v in hidden_states.items()
                                            if k in self.target_layers})
        length = int(next_tokens.numel())
        positions = torch.arange(self.n, self.n + length)
        out = self._run(hidden_in, next_tokens, positions, causal_allowed(length, self.n))
        self.n += length
        self._last_out = out[-1]
        self._last_logits = self._logits_of(out[-1:])[0]

    def _take_pending(self) -> tuple[torch.Tensor, dict[int, torch.Tensor]] | None:
        """The pairs committed since the head last ran, as one run of tokens (L,) and features {layer: (L, h)};
        None when there are none. They are the caller's to run now."""
        if not self._pending:
            return None
        tokens = torch.cat([t for t, _ in self._pending])
        hidden = {layer: torch.cat([h[layer] for _, h in self._pending]) for layer in self._pending[0][1]}
        self._pending = []
        return tokens, hidden

    def _catch_up(self) -> None:
        """Run the pairs committed since the head last ran, in one forward (after dropping its drafts)."""
        rollback(self._cache, self.n)
        pending = self._take_pending()
        if pending is not None:
            self._consume(*pending)

    @property
    def cache(self) -> DynamicCache:
        self._catch_up()
        return self._cache

    @property
    def _logits(self) -> torch.Tensor | None:
        self._catch_up()
        return self._last_logits

    # ------------------------------------------------------------------------------------ the interface
    def begin(self, prompt_ids, next_tokens, hidden_states) -> None:
        self._cache = head_cache(self.head)
        self.n = 0
        self.last = LastDraft()
        self.policy.new_context()
        self._last_out = self._last_logits = None
        self._pending = [(next_tokens, self._needed(hidden_states))]

    def commit(self, next_tokens, hidden_states) -> None:
        self.last.settle(self.policy, next_tokens)
        self._pending.append((next_tokens, self._needed(hidden_states)))

    def _needed(self, hidden_states: dict[int, torch.Tensor]) -> dict[int, torch.Tensor]:
        return {k: v for k, v in hidden_states.items() if k in self.target_layers}

    def _to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        if self.d2t is None:
            return draft_ids
        return draft_ids + self.d2t.cpu()[draft_ids]

    def propose(self, k: int, *, temperature: float = 0.0, generator: torch.Generator | None = None,
                tree=None) -> Draft:
        if not self.last.open(self.policy, always=tree is not None):
            return Draft.empty()
        with Stopwatch(self.policy.record_overhead):
            self._catch_up()
        assert self._last_logits is not None, "begin() must run before propose()"
        if tree is not None:
            return self._propose_tree(tree)
        return self._drive(self._chain(k, temperature, generator))

    def _drive(self, steps) -> Draft:
        """Run a `_chain` alone, one head forward per step."""
        try:
            request = next(steps)
            while True:
                with Stopwatch(self.policy.record_step):
                    out = self._step(*request)
                    logits = self._logits_of(out[None])[0]
                request = steps.send((out, logits, None))
        except StopIteration as done:
            return done.value

    def _step(self, out: torch.Tensor, target_id: torch.Tensor, position: int) -> torch.Tensor:
        """One drafted pair through the head: its previous output (h,) and token (1,) at `position` -> out (h,)."""
        return self._run(out[None], target_id, torch.tensor([position]),
                         causal_allowed(1, self._cache.get_seq_length()))[0]

    def _chain(self, k: int, temperature: float, generator: torch.Generator | None, reading: Reading | None = None):
        """A chain proposal as steps: yields (out (h,), token (1,) in the target's vocabulary, position) for the head
        to run next and is sent back (out (h,), logits (Vd,), their Reading or None); returns the Draft. One row
        drives it with `_step`, a batch of rows with one forward per step, their logits read together
        (serve/drafters/eagle_rows.py); `reading` is that of the head's last logits, where already read."""
        vocab = self.config.vocab_size
        tokens, qs = [], []
        out, logits = self._last_out, self._last_logits
        self.policy.start(k, sampled=temperature > 0)
        declined: list[int] = []  # a greedy draft the policy looked at and left out: still learned from
        greedy = temperature <= 0
        candidates = []  # runner-ups of the drafted positions (greedy), the chain's possible leaves
        for i in range(k):
            reading = reading or read_positions(logits[None], LEAF_RANKS)[0]
            # decided from the draft distribution before sampling from it: a sampled chain stays exact
            if not self.policy.offer(reading.confidence(min(i, 1))):
                declined = [reading.argmax] if greedy else []
                break
            token, q = sample_chain_token(logits, temperature=temperature, generator=generator, d2t=self.d2t,
                                          vocab_size=vocab, reading=reading)
            tokens.append(token)
            if q is not None:
                qs.append(q.cpu())
            if greedy and self.max_leaves:
                candidates += leaves_of(reading.top_probs, reading.top_ids, i + 1)
            if not self.policy.wants_more():
                break
            # the head's own output stands in for the target's feature of the drafted position
            out, logits, reading = yield out, self._to_target(torch.tensor([token])), self.n + i
        ids = self._to_target(torch.tensor(tokens, dtype=torch.long))
        self.last.tokens = self._to_target(torch.tensor(tokens + declined, dtype=torch.long)).tolist()
        if greedy:
            return hang_leaves(ids, candidates, self.policy, self.last, limit=self.max_leaves,
                               to_target=self._to_target)
        return Draft(tokens=ids, q=torch.stack(qs) if qs else None)

    @classmethod
    def propose_rows(cls, drafters: list[Drafter], calls: list[dict]) -> list[Draft]:
        """The chains of a batch's rows, one head forward for all rows' catch-up and one per draft position
        (serve/drafters/eagle_rows.py); trees, and drafters that propose otherwise (P-EAGLE), row by row."""
        from draftsmith.serve.drafters.eagle_rows import propose_chains

        if any(call.get("tree") is not None for call in calls) or \
                any(type(d).propose is not EagleDrafter.propose for d in drafters):
            return super().propose_rows(drafters, calls)
        return propose_chains(drafters, calls)

    def _propose_tree(self, spec) -> Draft:
        entry: dict[int, int] = {}  # tree node -> its cache index
        outs: dict[int, torch.Tensor] = {}

        def expand(nodes, depth, tokens, parents):
            past = self._cache.get_seq_length()
            length = len(nodes)
            allowed = torch.zeros(length, past + length, dtype=torch.bool)
            allowed[:, : self.n] = True
            hidden = []
            for row, node in enumerate(nodes):
                allowed[row, past + row] = True
                ancestor = parents[node]
                while ancestor >= 0:
                    allowed[row, entry[ancestor]] = True
                    ancestor = parents[ancestor]
                hidden.append(outs[parents[node]] if parents[node] >= 0 else self._last_out)
                entry[node] = past + row
            token_ids = self._to_target(torch.tensor([tokens[i] for i in nodes], dtype=torch.long))
            positions = torch.full((length,), self.n + depth - 1, dtype=torch.long)
            out = self._run(torch.stack(hidden), token_ids, positions, allowed)
            for row, node in enumerate(nodes):
                outs[node] = out[row]
            return torch.log_softmax(self._logits_of(out), dim=-1)

        root = torch.log_softmax(self._last_logits, dim=-1)
        tokens, parents = grow_tree(root, expand, spec, max_depth=spec.depth if not spec.is_static else 64)
        rollback(self._cache, self.n)
        return Draft(tokens=self._to_target(tokens), parents=parents)
