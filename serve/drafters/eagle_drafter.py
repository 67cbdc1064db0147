"""The drafting runtime shared by EAGLE-1 and EAGLE-3 heads: own KV cache, chains and EAGLE-2 dynamic trees.

State after begin/commit: the cache holds one entry per committed (feature t, token t+1) pair, computed
from the target's real features; `_out`/`_logits` belong to the last pair, whose next token is the
pending one. Proposals append entries for the head's own drafted pairs; the next commit crops them.
"""
from __future__ import annotations

import torch
from transformers import DynamicCache

from serve.drafters.base import Draft, Drafter
from serve.drafters.heads_common import confident, grow_tree, sample_chain_token
from serve.drafters.identity import check_target_identity
from serve.drafters.masks import additive, causal_allowed
from serve.kv import rollback


class EagleDrafter(Drafter):
    """Drives an Eagle1Head or Eagle3Head against a target (embeddings and, for EAGLE-1, lm_head from it)."""

    def __init__(self, head, target, *, check: bool = True, min_confidence: float = 0.0):
        self.head = head.eval().requires_grad_(False)
        self.min_confidence = min_confidence  # chains stop where the draft's top-1 probability falls below
        self.target = target
        self.config = head.config
        self.kind = self.config.method
        self.target_layers = tuple(self.config.aux_layer_ids)
        if check:
            self.check_target(target)
        self.embed = target.model.get_input_embeddings()
        self.lm_head = target.model.get_output_embeddings() if self.config.method == "eagle1" else None
        param = next(head.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.d2t = getattr(head, "d2t", None)
        self.cache = DynamicCache()
        self.n = 0
        self._out: torch.Tensor | None = None  # (h,)
        self._logits: torch.Tensor | None = None  # (Vd,)

    def check_target(self, target) -> None:
        check_target_identity(self.config, target)

    # ---------------------------------------------------------------------------------------- forward
    def _logits_of(self, out: torch.Tensor) -> torch.Tensor:
        """(L, h) -> (L, Vd) float."""
        if self.lm_head is not None:
            return self.lm_head(out.to(self.lm_head.weight.dtype)).float()
        return self.head.logits(out).float()

    @torch.no_grad()
    def _run(self, hidden_in: torch.Tensor, token_ids: torch.Tensor, positions: torch.Tensor,
             allowed: torch.Tensor) -> torch.Tensor:
        """hidden_in: (L, h); token_ids, positions: (L,); allowed: (L, cache_len + L) bool -> out (L, h)."""
        embeds = self.embed(token_ids.to(self.embed.weight.device)).to(self.device, self.dtype)
        out = self.head(hidden_in.to(self.device, self.dtype)[None], embeds[None],
                        position_ids=positions.to(self.device)[None],
                        attention_mask=additive(allowed.to(self.device), self.dtype)[None], cache=self.cache)
        return out[0]

    def _consume(self, next_tokens: torch.Tensor, hidden_states: dict[int, torch.Tensor]) -> None:
        """Append real pairs (features from the target) at positions n.. and keep the last output."""
        hidden_in = self.head.input_hidden({k: v.to(self.device, self.dtype) for k, v in hidden_states.items()
                                            if k in self.target_layers})
        length = int(next_tokens.numel())
        positions = torch.arange(self.n, self.n + length)
        out = self._run(hidden_in, next_tokens, positions, causal_allowed(length, self.n))
        self.n += length
        self._out = out[-1]
        self._logits = self._logits_of(out[-1:])[0]

    # ------------------------------------------------------------------------------------ the interface
    def begin(self, prompt_ids, next_tokens, hidden_states) -> None:
        self.cache = DynamicCache()
        self.n = 0
        self._consume(next_tokens, hidden_states)

    def commit(self, next_tokens, hidden_states) -> None:
        rollback(self.cache, self.n)
        self._consume(next_tokens, hidden_states)

    def _to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        if self.d2t is None:
            return draft_ids
        return draft_ids + self.d2t.cpu()[draft_ids]

    def propose(self, k: int, *, temperature: float = 0.0, generator: torch.Generator | None = None,
                tree=None) -> Draft:
        assert self._logits is not None, "begin() must run before propose()"
        rollback(self.cache, self.n)
        if tree is not None:
            return self._propose_tree(tree)
        vocab = self.config.vocab_size
        tokens, qs = [], []
        out, logits = self._out, self._logits
        for i in range(k):
            if not confident(logits, self.min_confidence):
                break
            token, q = sample_chain_token(logits, temperature=temperature, generator=generator, d2t=self.d2t,
                                          vocab_size=vocab)
            tokens.append(token)
            if q is not None:
                qs.append(q.cpu())
            if i + 1 < k:
                # the head's own output stands in for the target's feature of the drafted position
                pos = self.n + i
                target_id = self._to_target(torch.tensor([token]))
                out = self._run(out[None], target_id, torch.tensor([pos]),
                                causal_allowed(1, self.cache.get_seq_length()))[0]
                logits = self._logits_of(out[None])[0]
        ids = self._to_target(torch.tensor(tokens, dtype=torch.long))
        return Draft(tokens=ids, q=torch.stack(qs) if qs else None)

    def _propose_tree(self, spec) -> Draft:
        entry: dict[int, int] = {}  # tree node -> its cache index
        outs: dict[int, torch.Tensor] = {}

        def expand(nodes, depth, tokens, parents):
            past = self.cache.get_seq_length()
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
                hidden.append(outs[parents[node]] if parents[node] >= 0 else self._out)
                entry[node] = past + row
            token_ids = self._to_target(torch.tensor([tokens[i] for i in nodes], dtype=torch.long))
            positions = torch.full((length,), self.n + depth - 1, dtype=torch.long)
            out = self._run(torch.stack(hidden), token_ids, positions, allowed)
            for row, node in enumerate(nodes):
                outs[node] = out[row]
            return torch.log_softmax(self._logits_of(out), dim=-1)

        root = torch.log_softmax(self._logits, dim=-1)
        tokens, parents = grow_tree(root, expand, spec, max_depth=spec.depth if not spec.is_static else 64)
        rollback(self.cache, self.n)
        return Draft(tokens=self._to_target(tokens), parents=parents)
