"""A small causal LM as drafter. It must share the target's tokenizer: same vocabulary, same ids."""
from __future__ import annotations

from typing import ClassVar

import torch

from draftsmith.serve.drafters.base import Draft, Drafter
from draftsmith.serve.drafters.heads_common import confidence_signal
from draftsmith.serve.drafters.length import FixedLength, LastDraft, LengthPolicy, Stopwatch
from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.core.kv import cache_kwargs, new_cache, record_states, rollback
from draftsmith.serve.core.sampling import process_logits, sample
from draftsmith.serve.core.target import Target


class TokenizerMismatch(DraftsmithError):
    pass


def check_same_tokenizer(target_tokenizer, draft_tokenizer, *, what: str) -> None:
    """Same vocabulary (token -> id) and the same ids for the same strings, or a clear error."""
    tv, dv = target_tokenizer.get_vocab(), draft_tokenizer.get_vocab()
    if tv != dv:
        only_t = len(set(tv) - set(dv))
        moved = sum(1 for tok, i in tv.items() if tok in dv and dv[tok] != i)
        raise TokenizerMismatch(f"{what} has a different tokenizer than the target ({len(dv)} vs {len(tv)} tokens, "
                                f"{only_t} target tokens missing, {moved} with other ids); a draft model must use "
                                f"the target's tokenizer")
    probe = "def f(x):\n    return x * 2  # héllo 123"
    if target_tokenizer.encode(probe) != draft_tokenizer.encode(probe):
        raise TokenizerMismatch(f"{what} tokenizes text differently from the target (same vocabulary, other "
                                f"merges or normalization); a draft model must use the target's tokenizer")


class ModelDrafter(Drafter):
    """Autoregressive drafting with its own KV cache, rolled back to the accepted prefix after each cycle."""

    kind: ClassVar[str] = "model"

    def __init__(self, model, tokenizer, *, target_vocab_size: int, policy: LengthPolicy | None = None):
        self.model, self.tokenizer = model.eval().requires_grad_(False), tokenizer
        self.vocab = target_vocab_size
        self.policy = policy or FixedLength()  # how many tokens each cycle drafts
        self.last = LastDraft()
        self.tokens: list[int] = []
        self.cache = None
        self.cached = 0  # how many of self.tokens the cache holds

    def check_target(self, target: Target) -> None:
        check_same_tokenizer(target.tokenizer, self.tokenizer, what="the draft model")

    def begin(self, prompt_ids, next_tokens, hidden_states) -> None:
        self.tokens = [int(prompt_ids[0])] + next_tokens.tolist()
        self.cache, self.cached = new_cache(self.model), 0
        self.last = LastDraft()
        self.policy.new_context()

    def commit(self, next_tokens, hidden_states) -> None:
        self.last.settle(self.policy, next_tokens)
        self.tokens.extend(next_tokens.tolist())

    def _logits(self, logits: torch.Tensor) -> torch.Tensor:
        """Align the draft model's vocab width with the target's (embedding tables are often padded)."""
        if logits.shape[-1] >= self.vocab:
            return logits[..., : self.vocab]
        pad = logits.new_full((*logits.shape[:-1], self.vocab - logits.shape[-1]), float("-inf"))
        return torch.cat([logits, pad], dim=-1)

    @torch.inference_mode()
    def propose(self, k, *, temperature=0.0, generator=None, tree=None) -> Draft:
        if not self.last.open(self.policy):  # paused: the cache catches up on the skipped text when it next drafts
            return Draft.empty()
        device = self.model.device
        # The cache may hold drafts of the last cycle: keep only the prefix that matches the accepted text.
        valid = min(self.cached, len(self.tokens) - 1)
        rollback(self.cache, valid)
        feed = torch.tensor([self.tokens[valid:]], device=device)
        fed = len(self.tokens)  # what the cache will hold after the next forward
        drafted, dists, declined = [], [], []
        self.policy.start(k, sampled=temperature > 0)
        for i in range(k):
            with Stopwatch(self.policy.record_step):
                record_states(self.cache, feed.shape[1])  # a hybrid draft model rolls back to any of them
                logits = self._logits(self.model(feed, **cache_kwargs(self.model, self.cache),
                                                 logits_to_keep=1).logits[0, -1].float().cpu())
            self.cached = fed
            # decided from the draft distribution before sampling from it: a sampled chain stays exact
            if not self.policy.offer(confidence_signal(logits, min(i, 1))):
                declined = [int(logits.argmax())] if temperature <= 0 else []
                break
            if temperature > 0:
                q = process_logits(logits, temperature=temperature).softmax(-1)
                token = sample(q, generator)
                dists.append(q)
            else:
                token = int(logits.argmax())
            drafted.append(token)
            if not self.policy.wants_more():
                break
            feed = torch.tensor([[token]], device=device)
            fed += 1
        self.last.tokens = drafted + declined  # a greedy draft left out is still learned from
        return Draft(torch.tensor(drafted, dtype=torch.long), q=torch.stack(dists) if dists else None)
