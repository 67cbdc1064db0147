"""The hybrid drafter: which side drafts a cycle, the tree holding both, the spec, and its report names."""
from __future__ import annotations

import pytest
import torch

from draftsmith.serve.core.costs import VerifyCosts
from draftsmith.serve.drafters import DrafterSpecError, build_drafter
from draftsmith.serve.drafters.base import Draft, Drafter
from draftsmith.serve.methods.hybrid.arms import ArmLedger, accepted_depth
from draftsmith.serve.methods.hybrid.drafter import HybridDrafter, hybrid_of
from draftsmith.serve.drafters.length import ExpectedGain, FixedLength, LastDraft
from draftsmith.serve.methods.ngram.drafter import NgramDrafter
from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.tree import add_chain, chain_parents

FLAT = VerifyCosts(ratios={0: 1.0, 16: 1.0}, step_seconds=0.01)


class StubHead(Drafter):
    """A head that always drafts the same chain, with a length policy like the trained heads'."""
    kind = "eagle3"

    def __init__(self, chain, costs=FLAT):
        self.chain, self.policy, self.last = chain, ExpectedGain(costs), LastDraft()
        self.proposals = 0

    def propose(self, k, *, temperature=0.0, generator=None, tree=None):
        self.proposals += 1
        self.policy.start(k)
        n = self.policy.choose([("stub", 0.6)] * len(self.chain))
        self.last.tokens = self.chain[:k]
        return Draft(torch.tensor(self.chain[:n], dtype=torch.long))

    def commit(self, next_tokens, hidden_states):
        self.last.settle(self.policy, next_tokens)


def hybrid(chain, context, *, head_rate=1.0, costs=FLAT):
    head = StubHead(chain, costs)
    head.policy.rate = head_rate
    drafter = HybridDrafter(head, NgramDrafter(policy=ExpectedGain(costs)))
    ids = torch.tensor(context)
    drafter.begin(ids[:-1], ids[1:], {})
    return drafter, head


def test_accepted_depth_follows_the_produced_tokens_through_a_chain_or_a_tree():
    assert accepted_depth([4, 5, 6], None, [4, 5, 9]) == 2
    assert accepted_depth([4, 5], None, [4, 5, 6]) == 2  # every draft right, the bonus token after them
    assert accepted_depth([7], None, [4]) == 0
    # a tree: 4 -> 5 -> 6 and 4 -> 8; the produced tokens go down the second branch
    assert accepted_depth([4, 5, 6, 8], [-1, 0, 1, 0], [4, 8, 1]) == 2
    assert accepted_depth([4, 5, 6, 8], [-1, 0, 1, 0], [4, 5, 6, 7]) == 3


def test_the_ledger_is_neutral_until_a_cycle_is_scored_then_picks_the_best_rate():
    ledger = ArmLedger()
    assert ledger.best(("tree", "head", "ngram")) is None
    ledger.add({"ngram": (3, 1.2, 1.2), "head": (2, 1.3, 1.2), "tree": (3, 1.5, 1.4)})
    assert ledger.best(("tree", "head", "ngram")) == "ngram" and ledger.rate("ngram") == pytest.approx(2.5)
    ledger.add({"ngram": (1, 1.2, 1.2), "head": (4, 1.3, 1.2), "tree": (4, 1.5, 1.4)})
    assert ledger.best(("tree", "head", "ngram")) == "tree"  # 7/3.0 against 6/2.6 and 4/2.4
    assert ledger.best(("head", "ngram")) == "head"
    # with the head's work spent (0.1 a cycle), the comparison is of the verify forwards alone
    assert ledger.rate("head", sunk=True) == pytest.approx(6 / 2.4)
    ledger.clear()
    assert ledger.best(("head", "ngram")) is None and ledger.rate("head") == 0.0


def test_add_chain_shares_the_common_prefix():
    tokens, parents = add_chain(torch.tensor([1, 2, 3]), chain_parents(3), torch.tensor([1, 2, 4, 5]))
    assert tokens.tolist() == [1, 2, 3, 4, 5] and parents.tolist() == [-1, 0, 1, 1, 3]
    tokens, parents = add_chain(tokens, parents, torch.tensor([7]))
    assert tokens.tolist()[-1] == 7 and parents.tolist()[-1] == -1
    assert add_chain(torch.tensor([1, 2]), chain_parents(2), torch.tensor([1]))[0].tolist() == [1, 2]


def test_a_request_starts_neutral_both_chains_in_one_tree_and_every_arm_scored():
    # greedy: before any scored cycle a match drafts both; the cycle's tokens score all three arms
    costs = VerifyCosts(ratios={0: 1.0, 1: 1.1, 3: 1.3, 8: 1.8}, step_seconds=0.01)
    drafter, head = hybrid([9, 9, 9], [5, 1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4, 5, 6], costs=costs)
    drafter.draft_cap(3)
    draft = drafter.propose(3)
    assert draft.is_tree and head.proposals == 1 and drafter.choices == {"tree": 1}
    assert draft.tokens.tolist() == [9, 9, 9, 7, 8, 1]  # the head's chain, then the n-gram's beside it
    drafter.commit(torch.tensor([7, 8, 5]), {})  # the n-gram's first two right, the head's first wrong
    ledger = drafter.ledger
    assert ledger.cycles == 1 and ledger.tokens == {"ngram": 3, "head": 1, "tree": 3}
    work = ledger.cost["head"] - costs.ratio(3)  # the head's timed work, in target steps
    assert work >= 0 and ledger.cost["tree"] == pytest.approx(work + costs.ratio(6))
    assert ledger.cost["ngram"] == ledger.verify["ngram"] == pytest.approx(costs.ratio(3))
    assert ledger.verify["tree"] == pytest.approx(costs.ratio(6))
    # a new request starts neutral again
    ids = torch.tensor([5, 1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4, 5, 6])
    drafter.begin(ids[:-1], ids[1:], {})
    assert drafter.ledger.cycles == 0


def test_sampled_the_head_chain_is_verified_and_the_ngram_scored_beside_it():
    drafter, head = hybrid([9, 9, 9], [5, 1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4, 5, 6])
    drafter.draft_cap(3)
    draft = drafter.propose(3, temperature=0.7)
    assert not draft.is_tree and draft.tokens.tolist() == [9, 9, 9] and drafter.choices == {"head": 1}
    drafter.commit(torch.tensor([7, 2]), {})
    assert drafter.ledger.tokens["ngram"] == 2 and drafter.ledger.tokens["head"] == 1


def test_the_head_rests_only_while_the_ngram_leads_and_is_copying():
    context = [5, 1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4, 5, 6]
    drafter, head = hybrid([9, 9, 9], context)
    drafter.draft_cap(2)
    drafter.ledger.add({"ngram": (3, 1.0, 1.0), "head": (1, 1.2, 1.1), "tree": (3, 1.4, 1.3)})  # the n-gram leads this request
    draft = drafter.propose(2)  # but it is not known to be copying yet: the head drafts and is scored
    assert head.proposals == 1 and draft.tokens.tolist() == [7, 8] and drafter.choices == {"ngram": 1}
    drafter.commit(torch.tensor([7, 8, 1]), {})  # all right: a copy in progress
    assert drafter.ledger.cycles == 2 and drafter.ngram.copying
    assert drafter.propose(2).tokens.tolist() == [2, 3] and head.proposals == 1  # the head rests
    drafter.commit(torch.tensor([2, 9]), {})  # the n-gram's second token wrong: the copy has ended
    assert drafter.ledger.cycles == 2  # a cycle the head rested through is not scored
    drafter.propose(2)
    assert head.proposals == 2  # the head drafts again, and this cycle is scored


def test_once_the_head_has_drafted_its_work_is_sunk_and_the_verify_forwards_decide():
    # the n-gram chain leads counting the head's dear work (3/1.0 against 4/2.2), but the n-gram is not copying, so the
    # head drafts; its work spent, the tree's verify (4/1.3) beats the n-gram's (3/1.0)
    drafter, head = hybrid([9, 8, 7], [1, 2, 3, 4, 5, 1, 2])
    drafter.ledger.add({"ngram": (3, 1.0, 1.0), "head": (2, 2.0, 1.1), "tree": (4, 2.2, 1.3)})
    draft = drafter.propose(3)
    assert head.proposals == 1 and draft.is_tree and drafter.choices == {"tree": 1}
    assert any("work spent" in why for _, why in drafter.reasons)


def test_the_head_alone_when_it_leads():
    drafter, head = hybrid([9, 8, 7], [1, 2, 3, 4, 5, 1, 2])
    drafter.ledger.add({"ngram": (1, 1.0, 1.0), "head": (4, 1.3, 1.2), "tree": (4, 1.6, 1.5)})
    draft = drafter.propose(3)
    assert not draft.is_tree and draft.tokens.tolist() == [9, 8, 7] and drafter.choices == {"head": 1}


def test_without_a_match_the_head_drafts():
    drafter, head = hybrid([9, 9, 9], [1, 2, 3, 4, 5, 6, 7])
    draft = drafter.propose(3)
    assert draft.tokens.tolist() == [9, 9, 9] and head.proposals == 1 and drafter.choices == {"head": 1}
    drafter.commit(torch.tensor([9, 4]), {})  # the head's first draft accepted, its second not
    accepted, tried = head.policy.calibration[False].counts["stub"]
    assert accepted == pytest.approx(1.0, abs=0.01) and tried == pytest.approx(2.0, abs=0.01)


def test_the_ngram_side_may_draft_past_k_but_the_head_keeps_k():
    drafter, head = hybrid([9] * 12, [1, 2, 3, 4, 5, 6, 7])
    assert drafter.draft_cap(3) == 16  # the decoder's budget: the n-gram side's cap
    draft = drafter.propose(16)  # no match: the head drafts, at most the decoder's K
    assert head.proposals == 1 and draft.tokens.tolist() == [9, 9, 9]
    drafter, head = hybrid([9] * 12, [5, 1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4, 5, 6])
    drafter.draft_cap(3)
    drafter.ledger.add({"ngram": (3, 1.0, 1.0), "head": (1, 1.1, 1.0), "tree": (3, 1.2, 1.1)})  # the n-gram leads this request
    draft = drafter.propose(16)  # a match, not yet known to be copied: K (the head drafts to be scored)
    assert draft.tokens.tolist() == [7, 8, 1] and head.proposals == 1
    drafter.commit(torch.tensor([7, 8, 1, 2]), {})  # all right: the text copies, and the n-gram side drafts on
    assert drafter.propose(16).tokens.tolist() == [3, 4, 5, 6, 7, 8, 1, 2, 3, 4, 5, 6, 7, 8, 1, 2]  # a loop, flat costs


def test_a_tree_holds_both_when_the_tree_leads():
    drafter, head = hybrid([9, 8, 7], [1, 2, 3, 4, 5, 1, 2])
    drafter.ledger.add({"ngram": (1, 1.0, 1.0), "head": (2, 1.3, 1.2), "tree": (4, 1.6, 1.5)})
    draft = drafter.propose(3)
    assert draft.is_tree and drafter.choices == {"tree": 1}
    assert draft.tokens.tolist() == [9, 8, 7, 3, 4, 5] and draft.parents.tolist() == [-1, 0, 1, -1, 3, 4]
    sampled = drafter.propose(3, temperature=0.7)  # sampled: one chain, never a tree of one-hot guesses
    assert not sampled.is_tree


def test_hybrid_spec_errors(tiny_target_dir):
    from draftsmith.serve.core.target import load_target

    target = load_target(tiny_target_dir)
    with pytest.raises(DrafterSpecError, match="hybrid:DIR"):
        build_drafter("hybrid:", target)
    with pytest.raises(DrafterSpecError, match="needs a trained drafter"):
        build_drafter("hybrid:ngram", target)
    with pytest.raises(DraftsmithError, match="needs a trained drafter folder or model:PATH"):
        hybrid_of(build_drafter("ngram", target), FixedLength())


def test_hybrid_specs_parse_in_one_place(tmp_path):
    from draftsmith.serve.drafters.spec import default_name, parse_drafter_spec, spec_path, split_tree

    folder = tmp_path / "eagle3"
    folder.mkdir()
    spec = parse_drafter_spec(f"hybrid:{folder}:length=fixed@tree:depth=3")
    assert spec.kind == "hybrid" and spec.tree and spec.tree_shape == {"depth": 3}
    assert spec.head.kind == "folder" and spec.head.path == str(folder) and spec.head.options == {"length": "fixed"}
    small = parse_drafter_spec(f"model:{folder}:length=fixed")
    assert small.kind == "model" and small.path == str(folder) and small.options == {"length": "fixed"}
    assert parse_drafter_spec(f"hybrid:model:{folder}").head.kind == "model"
    assert default_name(f"hybrid:{folder}") == "hybrid:eagle3"
    assert default_name(f"hybrid:{folder}@tree") == "hybrid:eagle3-tree"
    assert spec_path(f"hybrid:{folder}:length=fixed") == str(folder.resolve())
    assert split_tree(f"hybrid:{folder}@tree")[0] == f"hybrid:{folder}"


def test_winners_per_domain():
    from draftsmith.eval.winners import winners

    def block(speedup, mu):
        return {"speedup": speedup, "mu": mu}

    result = {"settings": {"draft_length": {"ngram": "auto", "hybrid": "auto"}},
              "drafters": [{"name": "ngram", "kind": "ngram"}, {"name": "hybrid", "kind": "hybrid"},
                           {"name": "ceiling", "kind": "oracle"}],
              "domains": {"edit": {"ngram": block(2.0, 3.0), "hybrid": block(1.9, 2.9), "ceiling": block(3, 6)},
                          "chat": {"ngram": block(1.0, 1.1), "hybrid": block(1.2, 1.5), "ceiling": block(3, 6)}},
              "overall": {"ngram": block(1.4, 2.0), "hybrid": block(1.5, 2.1), "ceiling": block(3, 6)},
              "cost_model": {"drafters": {"hybrid": {"domains": {"chat": {"predicted_speedup": 1.25}},
                                                     "overall": {"predicted_speedup": 1.45}}}}}
    won = winners(result)
    assert won["edit"]["drafter"] == "ngram" and won["edit"]["runner_up"] == "hybrid"
    assert won["chat"] == {"drafter": "hybrid", "length": "auto", "speedup": 1.2, "predicted_speedup": 1.25,
                           "mu": 1.5, "runner_up": "ngram", "runner_up_speedup": 1.0, "tie": False}
    assert won["overall"]["predicted_speedup"] == 1.45
    assert not won["edit"]["tie"]  # no repeats: no resolution to call a tie by
    result["settings"]["timing_spread"] = 0.06  # repeats differed by 6%: 2.0 against 1.9 is a tie, 1.2 against 1.0 not
    won = winners(result)
    assert won["edit"]["tie"] and not won["chat"]["tie"] and won["edit"]["drafter"] == "ngram"


class TimedStubHead(StubHead):
    """A StubHead whose cycles are timed like a trained head's: it does no work while its policy pauses it."""

    def propose(self, k, *, temperature=0.0, generator=None, tree=None):
        if not self.last.open(self.policy):
            return Draft.empty()
        return super().propose(k, temperature=temperature, generator=generator, tree=tree)


def test_a_paused_head_does_not_time_the_ngram_verify_as_a_plain_step():
    head = TimedStubHead([9, 8, 7])
    head.policy = ExpectedGain(FLAT, overhead_cost=0.1)
    head.policy.rate, head.policy.plain_seconds = 5.0, 0.05  # paying: the hybrid asks the head ...
    head.policy._since_plain = head.policy.refresh  # ... which leaves this cycle plain to re-time the plain step
    drafter = HybridDrafter(head, NgramDrafter(policy=ExpectedGain(FLAT)))
    ids = torch.tensor([1, 2, 3, 4, 5, 1, 2])
    drafter.begin(ids[:-1], ids[1:], {})
    draft = drafter.propose(3)
    assert draft.tokens.tolist() == [3, 4, 5] and drafter.choices == {"ngram": 1}  # the n-gram chain alone
    assert not head.last.worked and not head.last.verified
    drafter.commit(torch.tensor([3, 4, 5, 6]), {})  # verified 3 drafts: not a plain step's time
    assert head.policy.plain_seconds == 0.05 and head.policy._refreshing  # the plain step is timed on a later cycle


def test_a_paused_head_leaves_the_choice_to_the_ngram_chain_against_a_plain_step():
    # verifying costs: a 1-draft forward 1.2 steps, 3 drafts 1.4; the n-gram's chain pays for itself against a plain step
    costs = VerifyCosts(ratios={0: 1.0, 1: 1.2, 3: 1.4, 16: 2.0}, step_seconds=0.01)
    head = TimedStubHead([9, 8, 7], costs)
    head.policy.overhead_cost = 0.1  # not negligible work: a head that does not pay pauses
    head.policy._accept = [0.95, 0.95, 0.95]  # its last working cycle's estimates: not this cycle's
    head.policy.rate, head.policy._wait = 0.5, 10 ** 6  # paused, and not retried this cycle
    drafter = HybridDrafter(head, NgramDrafter(policy=ExpectedGain(costs)))
    ids = torch.tensor([1, 2, 3, 4, 5, 1, 2])
    drafter.begin(ids[:-1], ids[1:], {})
    draft = drafter.propose(3)
    assert not head.last.worked
    # a neutral request asks the head first; paused, it drafts nothing, so the n-gram chain goes alone and the cycle
    # scores no arm (there is no head draft to score)
    assert draft.tokens.tolist() == [3, 4, 5] and drafter.choices == {"ngram": 1}
    drafter.commit(torch.tensor([3, 4, 9]), {})
    assert drafter.ledger.cycles == 0
