"""The hybrid drafter (`hybrid:DIR`): each cycle the n-gram continuation, the trained head's draft, or (greedy) a
tree holding both, whichever has yielded the most tokens per target step on this request so far.

The two are complementary: the n-gram drafter is nearly free and wins where the answer copies the prompt (edit,
extraction, summarization, code); a trained head wins in free text (chat, creative writing, math). Both see every
cycle's tokens (`commit`), so either can draft the next cycle; each one's length policy learns from every
verification, including how its unused proposals would have fared.

The choice rests on no constant fitted to any text. Every cycle in which both parts proposed scores the three arms
(serve/methods/hybrid/arms.py): the tokens each would have produced, which are known once the cycle's tokens are (a tree
holding both chains produces the more of the two), against each one's cost in target steps (the verify forward over
its nodes, measured on the target, plus the head's work as timed). A request starts neutral: until a cycle has been
scored, a cycle with an n-gram proposal drafts both (the tree at temperature 0, the head's chain beside the n-gram's
counterfactual when sampling). From then on the head rests (the n-gram chain goes alone, unscored) only while the
n-gram's arm has the best rate on the request's scored cycles and its last proposal was right on every token it
could be checked on: a copy in progress. The first n-gram miss brings the head back, so the scores are retaken as
soon as the text stops being copied. Once the head has drafted, its work is spent whichever arm is verified: the arm
verified is the one whose tokens best paid for their verify forward alone on the scored cycles.
"""
from __future__ import annotations

import time
from collections import Counter
from typing import ClassVar

from draftsmith.serve.methods.hybrid.arms import ArmLedger, accepted_depth
from draftsmith.serve.drafters.base import Draft, Drafter
from draftsmith.serve.drafters.length import ExpectedGain
from draftsmith.serve.methods.ngram.drafter import NgramDrafter
from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.methods.registry import has
from draftsmith.serve.tree import add_chain, chain_parents
from draftsmith.serve.core.target import Target

RESTS = "the n-gram copying, and its chain alone led this request's scored cycles: the head rested"
WHY = {"ngram": "the head's work spent, the n-gram chain led this request's scored cycles per verify step",
       "head": "the head's work spent, its draft led this request's scored cycles per verify step",
       "tree": "the head's work spent, the tree of both led this request's scored cycles per verify step",
       None: "no scored cycle on this request yet: both drafted"}


class HybridDrafter(Drafter):
    kind: ClassVar[str] = "hybrid"

    def __init__(self, head: Drafter, ngram: NgramDrafter, *, trees: bool = True):
        self.head, self.ngram, self.trees = head, ngram, trees
        self.target_layers = tuple(head.target_layers)
        self.policy = head.policy
        self.default_k, self.default_tree = head.default_k, head.default_tree  # what the head's folder records
        self.choices: Counter = Counter()  # cycles drafted by "ngram", "head", "tree" (both), "none"
        self.reasons: Counter = Counter()  # (part, why) per cycle: what eval's report says of the hybrid's choices
        self.ledger = ArmLedger()  # this request's scored cycles
        self._head_k: int | None = None  # the decoder's K: the head drafts at most that, the n-gram side its own cap
        self._source: Drafter | None = None  # the side whose chain the last proposal is (None: a joined tree)
        self._scoring: tuple | None = None  # (n-gram chain, head tokens, head parents, head work) of this cycle

    def check_target(self, target: Target) -> None:
        self.head.check_target(target)

    def parts(self) -> tuple[Drafter, ...]:
        return (*self.head.parts(), *self.ngram.parts())

    def draft_cap(self, k: int) -> int:
        self._head_k = k
        return self.ngram.draft_cap(k)

    def begin(self, prompt_ids, next_tokens, hidden_states) -> None:
        self.ngram.begin(prompt_ids, next_tokens, hidden_states)
        self.head.begin(prompt_ids, next_tokens, hidden_states)
        self.ledger.clear()
        self._scoring = None

    def commit(self, next_tokens, hidden_states) -> None:
        if self._scoring is not None:
            self._score([int(t) for t in next_tokens])
            self._scoring = None
        self.ngram.commit(next_tokens, hidden_states)
        self.head.commit(next_tokens, hidden_states)

    def chain_acceptance(self, draft: Draft) -> list[float] | None:
        return self._source.chain_acceptance(draft) if self._source is not None else None

    # ---------------------------------------------------------------------------------------- scoring
    def _costs(self):
        gains = self.head.policy
        return gains.costs if isinstance(gains, ExpectedGain) and isinstance(self.ngram.policy, ExpectedGain) else None

    def _score(self, produced: list[int]) -> None:
        """Score every arm on this cycle's tokens (greedy: exact; sampled: the head's chain was the one verified,
        and the n-gram's one-hot chain is right on a token as often as the target samples it)."""
        ngram, head_tokens, head_parents, work, tree_nodes = self._scoring
        costs = self._costs()
        d_ngram = accepted_depth(ngram, None, produced)
        d_head = accepted_depth(head_tokens, head_parents, produced)
        verify = {"ngram": costs.ratio(len(ngram)), "head": costs.ratio(len(head_tokens)),
                  "tree": costs.ratio(tree_nodes)}
        self.ledger.add({"ngram": (d_ngram + 1, verify["ngram"], verify["ngram"]),
                         "head": (d_head + 1, work + verify["head"], verify["head"]),
                         "tree": (max(d_ngram, d_head) + 1, work + verify["tree"], verify["tree"])})

    # ---------------------------------------------------------------------------------------- choosing
    def _chose(self, part: str, why: str) -> None:
        self.choices[part] += 1
        self.reasons[(part, why)] += 1

    def _head_alone(self, k, temperature, generator, tree, why: str) -> Draft:
        draft = self.head.propose(k, temperature=temperature, generator=generator, tree=tree)
        self._chose("head" if len(draft) else "none", why if len(draft) else f"{why}, but the head paused")
        self._source = self.head
        return draft

    def _ngram_alone(self, ngram: Draft, why: str) -> Draft:
        self._chose("ngram", why)
        self._source = self.ngram
        return ngram

    def propose(self, k, *, temperature=0.0, generator=None, tree=None) -> Draft:
        self._source, self._scoring = None, None
        head_k = k if self._head_k is None else min(k, self._head_k)
        ngram = self.ngram.propose(k, temperature=temperature, generator=generator)
        if not len(ngram):
            self.ngram.last.verified = False
            return self._head_alone(head_k, temperature, generator, tree, "no n-gram match")
        costs = self._costs()
        if costs is None:  # fixed lengths: nothing to weigh costs with; the n-gram drafter wherever it matches
            return self._ngram_alone(ngram, "a match (fixed lengths)")
        greedy = temperature <= 0
        arms = ("tree", "head", "ngram") if greedy and self.trees else ("head", "ngram")
        best = self.ledger.best(arms)
        if best == "ngram" and self.ngram.copying:
            return self._ngram_alone(ngram, RESTS)
        # the head drafts: its work buys this cycle's score of every arm
        self.ngram.last.verified = False  # learned from as a proposal, timed only if verified below
        started = time.perf_counter()
        draft = self.head.propose(head_k, temperature=temperature, generator=generator, tree=tree)
        work = (time.perf_counter() - started) / costs.step_seconds if costs.step_seconds > 0 else 0.0
        worked = bool(len(draft)) or getattr(getattr(self.head, "last", None), "worked", False)
        # the tree of both, built once: scored below and verified when it is the arm chosen. A greedy chain may carry
        # leaves (serve/drafters/leaves.py), an @tree head drafts a tree: the n-gram chain joins either as a branch
        parents = draft.parents if draft.is_tree else chain_parents(len(draft))
        tokens, tree_parents = add_chain(draft.tokens, parents, ngram.tokens)
        if worked:  # a head that chose to draft nothing is scored too: its arm is a plain step after its work
            self._scoring = (ngram.tokens.tolist(), draft.tokens.tolist(), parents.tolist(), work, len(tokens))
        if not len(draft):  # the n-gram chain alone; the cycle is not the head's plain step to time
            self.ngram.last.verified = True
            self.head.last.verified = False
            return self._ngram_alone(ngram, "the head drafted nothing" if worked else "the head paused")
        if draft.is_tree and tree is not None:  # the head drafted a tree (@tree): the n-gram chain joins it
            self._chose("tree", "the n-gram chain joins the head's tree")
            return Draft(tokens=tokens, parents=tree_parents)
        # the head's work is spent: verify the arm whose tokens best pay for their verify forward on this request
        sunk = self.ledger.best(arms, sunk=True)
        why, verified = WHY[sunk], sunk or arms[0]
        if not greedy or verified == "head":  # sampled: the head's chain keeps its q and is what gets verified
            self._chose("head", why)
            self._source = self.head
            return draft
        if verified == "ngram":  # the n-gram not copying: the head was scored, the n-gram chain is verified
            self.head.last.verified = False
            self.ngram.last.verified = True
            return self._ngram_alone(ngram, why)
        self._chose("tree", why)  # one-hot proposals in a tree verify exactly
        return Draft(tokens=tokens, parents=tree_parents)


def hybrid_of(head: Drafter, ngram_policy) -> HybridDrafter:
    """The hybrid of a built head drafter and an n-gram drafter with `ngram_policy`."""
    if not (has(head.kind, "trained") or has(head.kind, "assistant")):
        raise DraftsmithError(f"hybrid:SPEC needs a trained drafter folder or model:PATH, got a {head.kind} drafter")
    return HybridDrafter(head, NgramDrafter(policy=ngram_policy))
