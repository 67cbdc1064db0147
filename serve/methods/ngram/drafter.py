"""Prompt lookup (n-gram) drafting: propose what followed the earlier occurrence of the current suffix that
matches it longest.

transformers' prompt lookup (`prompt_lookup_num_tokens`) takes the first occurrence of the last 2 (else 1)
tokens and always drafts K. Here every earlier occurrence of the last token is extended backwards, the one
matching the longest suffix wins (the most recent on ties), and the match length is the signal the length
policy reads: a long match is a copied passage and drafts far, a 2-token match in free text drafts little or
nothing.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from draftsmith.serve.core.costs import DEFAULT_SIZES
from draftsmith.serve.drafters.base import Draft, Drafter
from draftsmith.serve.drafters.length import FixedLength, LastDraft, LengthPolicy, Signal


@dataclass(frozen=True)
class Match:
    start: int  # index of the first continuation token in the sequence
    length: int  # how many tokens before `start` equal the sequence's last tokens
    # do the other equally long matches continue the same way? "single" (the only one), "agree" (all do),
    # "major" (half or more), "split" (fewer): a split context rarely continues like its latest occurrence
    agreement: str = "single"


def longest_match(tokens: torch.Tensor, *, min_n: int, max_n: int) -> Match | None:
    """tokens: (L,) the sequence so far -> the earlier position whose preceding tokens match the sequence's
    last ones longest (counted up to max_n; the most recent on ties), None if no match reaches min_n."""
    length = tokens.numel()
    if length < 2:
        return None
    ends = (tokens[: length - 1] == tokens[-1]).nonzero().flatten()  # (C,) earlier copies of the last token
    if ends.numel() == 0:
        return None
    back = torch.arange(max_n)  # (max_n,)
    index = ends[:, None] - back[None, :]  # (C, max_n): positions walking back from each copy
    suffix = tokens[length - 1 - back.clamp(max=length - 1)]  # (max_n,): the sequence's last tokens, backwards
    agree = (index >= 0) & (tokens[index.clamp(min=0)] == suffix[None, :])
    lengths = agree.long().cumprod(dim=1).sum(dim=1)  # (C,) matched run from each copy backwards
    best = int(lengths.max())
    if best < min_n:
        return None
    tied = ends[lengths == best]  # (T,) every copy with the longest match, oldest first
    following = tokens[tied + 1]  # (T,) what followed each
    share = float((following == following[-1]).float().mean())
    agreement = "single" if tied.numel() == 1 else "agree" if share == 1.0 else "major" if share >= 0.5 else "split"
    return Match(start=int(tied[-1]) + 1, length=best, agreement=agreement)


def continuation(tokens: torch.Tensor, start: int, k: int) -> torch.Tensor:
    """tokens: (L,) -> the k tokens from `start` on, the sequence's last L - start tokens repeated past its end.

    A match `start` that is p = L - start tokens back says the text repeats with period p; where its continuation
    runs into the sequence's end (a loop such as "o que o que ...", a list with one repeated line) the period
    goes on, so a recent match drafts all k, not just the p tokens it holds."""
    period = tokens.numel() - start  # >= 1: the match's copy of the last token is an earlier one
    return tokens[start + torch.arange(k) % period] if k > 0 else tokens[:0]


def lookup(tokens: torch.Tensor, *, k: int, max_n: int, min_n: int) -> torch.Tensor:
    """k tokens that followed the longest match of the sequence's suffix; empty when nothing matches."""
    match = longest_match(tokens, min_n=min_n, max_n=max_n)
    return tokens[:0] if match is None else continuation(tokens, match.start, k)


# Acceptance before any evidence, derived rather than measured (the calibration replaces it as drafts are verified:
# serve/drafters/calibration.py, worth `prior_weight` drafts). A match of length L is L tokens in a row in which the
# text agreed with its earlier copy; knowing nothing of the text, Laplace's rule of succession puts the next agreement
# at (L+1)/(L+2), and a draft i tokens into an accepted continuation has agreed L+i times. The first draft also
# depends on whether the other equally long matches continue the same way: it is scaled by the middle of its
# agreement category's share (Match: "single" and "agree" 1, "major" [0.5, 1) 0.75, "split" (0, 0.5) 0.25). No number
# here was fitted to any text: a table measured on one target's answers (as this once was) says little of another's.
LENGTH_BUCKETS = (1, 2, 3, 4, 6, 10, 16)  # keys: the calibration learns one estimate per bucket of match lengths
AGREEMENT_SHARE = {"single": 1.0, "agree": 1.0, "major": 0.75, "split": 0.25}


def succession(agreed: int) -> float:
    """Laplace's rule of succession: after `agreed` agreements in a row, the chance of the next, (n+1)/(n+2)."""
    return (agreed + 1) / (agreed + 2)


# A match length means different things in different texts: in a summary a 2-token match is the start of a copied
# phrase, in a multi-turn answer a coincidence. The length policy's estimates for the current generation are its
# own drafts' outcomes, with the estimate pooled over every generation worth this many of them (docs/results.md,
# "What this text makes of a match"). A weak prior of a few drafts: the current text overrides what other texts
# taught from its fifth draft of a key on, whatever the text (2 and 8 measured within 1% of 4 on the held-out prompts,
# so the value is a choice of prior strength, not a fit).
LOCAL_WEIGHT = 4.0
# Before any key has been tried often enough here, the current generation's drafts of every key say whether its text
# copies: the pooled estimates' odds are scaled by how its drafts fared against them, with this many pseudo-drafts
# at the pooled rate (serve/drafters/length.py, generation_factor; docs/results.md, "What this text makes of a match").
# Two pseudo-drafts: the scale stays 1 until the generation has drafted, and two drafts against the estimates already
# move it halfway, the fastest a ratio of small counts can move without one draft deciding it.
GENERATION_WEIGHT = 2.0


def match_signal(match: Match, position: int) -> Signal:
    """The policy signal of the continuation's token `position` (0-based) after `match`."""
    bucket = max(n for n in LENGTH_BUCKETS if n <= max(1, match.length))
    if position == 0:
        return ("ngram", bucket, match.agreement, 0), succession(bucket) * AGREEMENT_SHARE[match.agreement]
    step = min(position, 3)
    return ("ngram", bucket, step), succession(bucket + step)


class NgramDrafter(Drafter):
    kind: ClassVar[str] = "ngram"

    def __init__(self, *, max_n: int = 16, min_n: int | None = None, policy: LengthPolicy | None = None,
                 max_k: int | None = None):
        self.policy = policy or FixedLength()  # how many continuation tokens each cycle drafts
        # max_k: with a per-step length, a cycle may draft up to max(K, max_k) tokens. A copied passage is accepted
        # far past K, extending the proposal costs nothing, and a verify forward's cost grows slowly past a few
        # tokens (this CPU, fp32: 16 drafts 1.6-2.0 steps, 5 drafts 1.2-1.6), so the policy, which weighs every token,
        # decides how far (docs/results.md, "Copied passages past K"). A fixed length drafts K. Default: the longest
        # verify serve/core/costs.py measures.
        if max_k is None:
            max_k = 0 if isinstance(self.policy, FixedLength) else max(DEFAULT_SIZES) - 1
        if max_k < 0:
            raise ValueError(f"ngram needs max_k >= 0 (0: K), got {max_k}")
        self.max_k = max_k
        # min_n: the shortest match that drafts. At a fixed K a single-token match drafts too often on free text,
        # where each rejected verify costs ~1.6x a step on CPU (free writing 0.85x with min_n=1, 0.96x with 2);
        # a per-step length weighs a one-token match at what it is worth (often one nearly free token), so 1.
        if min_n is None:
            min_n = 2 if isinstance(self.policy, FixedLength) else 1
        if not 1 <= min_n <= max_n:
            raise ValueError(f"ngram needs 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
        self.max_n, self.min_n = max_n, min_n
        self.last = LastDraft()
        self.tokens = torch.empty(0, dtype=torch.long)
        # copying: the last proposal was right on every token the target's output could check it on. A cycle drafts
        # past K only then (reach="copying"): in a copied passage the next match goes on as far, while in free text
        # a long draft the policy finds worth its flat verify cost is mostly rejected at its first token
        # (reach="always": qa and multiturn 3-5% slower on the modelled clock; docs/results.md, "Copied passages
        # past K")
        self.copying, self.reach = False, "copying"
        self._k: int | None = None  # the decoder's K (draft_cap)

    def draft_cap(self, k: int) -> int:
        self._k = k
        return max(k, self.max_k) if k > 0 else k

    def begin(self, prompt_ids, next_tokens, hidden_states) -> None:
        self.tokens = torch.cat([prompt_ids[:1], next_tokens]).long()
        self.last = LastDraft()
        self.policy.new_context()
        self.copying = False

    def commit(self, next_tokens, hidden_states) -> None:
        proposed = len(self.last.tokens or ())
        matched = self.last.settle(self.policy, next_tokens)  # its proposal, drafted or not, against the target's
        self.copying = matched is not None and matched == min(proposed, len(next_tokens)) and matched > 0
        self.tokens = torch.cat([self.tokens, next_tokens.long()])

    def propose(self, k, *, temperature=0.0, generator=None, tree=None) -> Draft:
        # the lookup costs microseconds: its cost is left out of the policy, whose choices then depend only on
        # the text and the verify costs (the same prompt drafts the same way)
        if self.reach == "copying" and not self.copying and self._k is not None:
            k = min(k, self._k)
        match = longest_match(self.tokens, min_n=self.min_n, max_n=self.max_n)
        proposal = self.tokens[:0] if match is None else continuation(self.tokens, match.start, k)
        self.policy.start(k, sampled=temperature > 0)
        # deterministic proposals: any rule of the context keeps sampling exact
        n = self.policy.choose([match_signal(match, i) for i in range(proposal.numel())]) \
            if match is not None else 0
        self.last.tokens = proposal.tolist()  # the whole proposal is learned from, drafted or not
        return Draft(proposal[:n].clone())
