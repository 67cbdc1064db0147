"""The hybrid drafter (`hybrid:DIR`): each cycle, the n-gram continuation where the context holds a match
expected to beat the trained head, the head's draft elsewhere; at temperature 0 a tree holding both where
the extra verified tokens are expected to pay for themselves.

The two are complementary: the n-gram drafter is nearly free and wins where the answer copies the prompt
(edit, extraction, summarization, code); a trained head wins in free text (chat, creative writing, math).
Both see every cycle's tokens (`commit`), so either can draft the next cycle; each one's length policy
learns from every verification, including how its unused proposals would have fared. The head's rate is measured
only on the cycles it drafts, so after `explore` n-gram cycles in a row the head is put on trial (a few cycles of
its own drafts): without it, a head whose rate was last measured on a stretch it did badly on never drafted
again, however well it would now do. Conversely, after `doubt_after` n-gram proposals in a row whose first token
was wrong, the head drafts until an n-gram proposal is right again.
"""
from __future__ import annotations

from collections import Counter
from typing import ClassVar

from serve.drafters.base import Draft, Drafter
from serve.drafters.length import ExpectedGain
from serve.drafters.length_model import expected_tokens
from serve.drafters.ngram import NgramDrafter
from serve.core.errors import DraftsmithError
from serve.tree import add_chain, chain_parents

HEAD_KINDS = ("eagle1", "eagle3", "medusa", "model")


def tree_tokens(head: list[float], ngram: list[float], shared: int) -> float:
    """Expected tokens of a tree holding two chains that agree on their first `shared` drafts.

    head, ngram: each chain's acceptance probabilities a_i. Shared drafts are one node each, taken at the
    likelier estimate; after the chains part, at most one of the two differing drafts can be the target's
    token, so their acceptances are scaled to sum to at most 1."""
    prefix = [max(h, n) for h, n in zip(head[:shared], ngram[:shared])]
    total = expected_tokens(prefix)[-1]
    reach = 1.0
    for a in prefix:
        reach *= a
    rest_h, rest_n = head[shared:], ngram[shared:]
    if rest_h and rest_n and rest_h[0] + rest_n[0] > 1.0:
        scale = 1.0 / (rest_h[0] + rest_n[0])
        rest_h, rest_n = [rest_h[0] * scale] + rest_h[1:], [rest_n[0] * scale] + rest_n[1:]
    for branch in (rest_h, rest_n):
        total += reach * (expected_tokens(branch)[-1] - 1.0)
    return total


class HybridDrafter(Drafter):
    kind: ClassVar[str] = "hybrid"

    def __init__(self, head: Drafter, ngram: NgramDrafter, *, trees: bool = True, explore: int = 16):
        self.head, self.ngram, self.trees, self.explore = head, ngram, trees, explore
        self._ngram_run = 0  # n-gram cycles in a row since the head last drafted
        self.target_layers = tuple(head.target_layers)
        self.policy = head.policy
        self.default_k, self.default_tree = head.default_k, head.default_tree  # what the head's folder records
        self.choices: Counter = Counter()  # cycles drafted by "ngram", "head", "tree" (both), "none"
        self.reasons: Counter = Counter()  # (part, why) per cycle: what eval's report says of the hybrid's choices
        # after this many n-gram proposals in a row whose first token was wrong, the head drafts (the n-gram's
        # chain joins its tree where that pays) until an n-gram proposal is right again: in retrieval, multi-turn
        # and chat answers the context holds long matches that the answer only resembles, and the calibration,
        # pooled over the text where such matches are copied, kept the n-gram drafting them (docs/results.md, "The
        # hybrid on the modelled clock")
        self.doubt_after = 3
        self._head_k: int | None = None  # the decoder's K: the head drafts at most that, the n-gram side its own cap
        self._source: Drafter | None = None  # the side whose chain the last proposal is (None: a joined tree)

    def check_target(self, target) -> None:
        self.head.check_target(target)

    def draft_cap(self, k: int) -> int:
        self._head_k = k
        return self.ngram.draft_cap(k)

    def begin(self, prompt_ids, next_tokens, hidden_states) -> None:
        self.ngram.begin(prompt_ids, next_tokens, hidden_states)
        self.head.begin(prompt_ids, next_tokens, hidden_states)

    def commit(self, next_tokens, hidden_states) -> None:
        self.ngram.commit(next_tokens, hidden_states)
        self.head.commit(next_tokens, hidden_states)

    # ---------------------------------------------------------------------------------------- choosing
    def _gains(self) -> tuple[ExpectedGain, ExpectedGain] | None:
        ng, head = self.ngram.policy, self.head.policy
        return (ng, head) if isinstance(ng, ExpectedGain) and isinstance(head, ExpectedGain) else None

    def _ngram_wins(self, ngram: Draft) -> bool:
        """The n-gram draft's expected rate against the head's realized one (the head's work per cycle is paid
        either way, so it is charged to both)."""
        if not len(ngram):
            return False
        gains = self._gains()
        if gains is None:  # fixed lengths: the n-gram drafter whenever the context holds a match
            return True
        ng, head = gains
        rate = expected_tokens(ng.kept)[-1] / (ng.cost(len(ngram)) + head.overhead_cost)
        return rate >= head.rate

    def _tree_pays(self, ngram: Draft, head_draft: Draft) -> bool:
        gains = self._gains()
        if gains is None:
            return False
        ng, head = gains
        # a head paused this cycle kept no drafts (`LastDraft.open`) and did no work: the choice is then the n-gram
        # chain against a plain step
        worked = self.head.last.worked
        chain = head_draft.tokens[: len(head.kept)]  # a chain with leaves lists the chain first
        shared = 0
        for a, b in zip(ngram.tokens.tolist(), chain.tolist()):
            if a != b:
                break
            shared += 1
        if shared == len(ngram):
            return False  # the head's chain already holds the n-gram's
        nodes = len(head_draft) + len(ngram) - shared  # the head's leaves are verified either way
        spent = ng.overhead_cost + (head.overhead_cost + len(chain) * head.step_cost if worked else 0.0)
        tree_rate = tree_tokens(head.kept, ng.kept, shared) / (spent + head.costs.ratio(nodes))
        head_rate = expected_tokens(head.kept)[-1] / (spent + head.costs.ratio(len(head_draft)))
        return tree_rate > head_rate

    def _probe_head(self) -> bool:
        """After `explore` n-gram cycles in a row: put the head on trial (its rate is stale) and let it draft."""
        gains = self._gains()
        if gains is None or self._ngram_run < self.explore:
            return False
        gains[1].probe()
        return True

    def chain_acceptance(self, draft: Draft) -> list[float] | None:
        return self._source.chain_acceptance(draft) if self._source is not None else None

    def _chose(self, part: str, why: str) -> None:
        self.choices[part] += 1
        self.reasons[(part, why)] += 1

    def _why_head(self, ngram: Draft, doubted: bool, probed: bool) -> str:
        if not len(ngram):
            return "no n-gram match"
        if doubted:
            return f"the n-gram's last {self.doubt_after}+ proposals missed"
        if probed:
            return f"the head on trial after {self.explore} n-gram cycles"
        return "the head's rate above the n-gram draft's"

    def propose(self, k, *, temperature=0.0, generator=None, tree=None) -> Draft:
        self._source = None
        ngram = self.ngram.propose(k, temperature=temperature, generator=generator)
        doubted = self.ngram.misses >= self.doubt_after
        wins = not doubted and self._ngram_wins(ngram)
        probed = wins and self._probe_head()
        if wins and not probed:
            self._ngram_run += 1
            self._chose("ngram", "its expected rate above the head's" if self._gains() is not None
                        else "a match (fixed lengths)")
            self._source = self.ngram
            return ngram
        why = self._why_head(ngram, doubted, probed)
        self._ngram_run = 0
        self.ngram.last.verified = False  # learn how it would have fared, but it is not this cycle's draft
        head_k = k if self._head_k is None else min(k, self._head_k)
        draft = self.head.propose(head_k, temperature=temperature, generator=generator, tree=tree)
        if len(ngram) and draft.is_tree and tree is not None:  # the head drafted a tree: the n-gram chain joins it
            tokens, parents = add_chain(draft.tokens, draft.parents, ngram.tokens)
            self._chose("tree", "the n-gram chain joins the head's tree")
            return Draft(tokens=tokens, parents=parents)
        if len(ngram) and temperature <= 0 and self.trees and self._tree_pays(ngram, draft):
            # one-hot proposals in a tree verify exactly; greedy only, so a sampled head chain keeps its q. A
            # greedy chain may carry leaves (serve/drafters/leaves.py): the n-gram chain joins them as a branch
            parents = draft.parents if draft.is_tree else chain_parents(len(draft))
            tokens, parents = add_chain(draft.tokens, parents, ngram.tokens)
            self._chose("tree", f"{why}; both chains in one tree pay")
            if not self.head.last.worked:  # a paused head would time the n-gram's verify as a plain step
                self.head.last.verified = False
            return Draft(tokens=tokens, parents=parents)
        self._chose("head" if len(draft) else "none", why if len(draft) else f"{why}, but the head paused")
        self._source = self.head
        return draft


def hybrid_of(head: Drafter, ngram_policy) -> HybridDrafter:
    """The hybrid of a built head drafter and an n-gram drafter with `ngram_policy`."""
    if head.kind not in HEAD_KINDS:
        raise DraftsmithError(f"hybrid:SPEC needs a trained drafter folder or model:PATH, got a {head.kind} drafter")
    return HybridDrafter(head, NgramDrafter(policy=ngram_policy))
