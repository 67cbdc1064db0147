"""Draft length chosen per step: a cycle drafts while one more token is expected to pay for itself.

A cycle that drafts n tokens costs, in target steps (a 1-token target forward = 1),

    C(n) = o + n·c + V(n)

o: the drafter's own work per drafting cycle (running the head over the tokens committed since it last
drafted), c: one draft step, V(n): the verify forward over n + 1
tokens (V(0) = 1, a plain step; measured on the target, serve/core/costs.py). It yields

    E(n) = 1 + P_1 + ... + P_n,   P_i = a_1·...·a_i,

a_i = P(draft i accepted | drafts 1..i-1 accepted), read from the drafter's own signal (the draft's top-1
probability, an n-gram's match length) through a calibration learned from the drafter's verified drafts: over
every generation the drafter has run and, for a drafter whose signal means different things in different texts
(an n-gram's match length), within the current generation too, shrunk towards the first. That drafter's pooled
estimates are first scaled by how the current generation's drafts of every key fared against them (an odds
ratio: accepted and rejected drafts against what the pooled estimates expected): a text that copies nothing
says so within a few drafts, long before each of its keys has been tried often enough to say it alone.
The cycle keeps the length with the best rate E(n)/C(n): the situations that favour a drafter (a copied
passage, a formulaic phrase) last for several tokens, so each cycle should be as fast per token as the
current situation allows (Leviathan et al. 2023, https://arxiv.org/abs/2211.17192, sec. 3.5, with V and c
measured rather than assumed).

Whether the drafter runs at all is decided from what its cycles really took, against a plain step's wall time
(serve/drafters/pause.py). The model's parts: E(n) and the best rate in serve/drafters/length_model.py, the
calibrated acceptance in serve/drafters/calibration.py.

Drafters that draft step by step (EAGLE, a draft model) cannot see a_{i+1} before paying for it: `offer`
decides token i with a_i known and a_{i+1}, ... projected as a_i. Drafters that see the whole proposal at
once (n-gram, Medusa) call `choose`. Both decide from information available before a token is sampled, so
a sampled chain stays an exact speculative sample (the length never depends on the sampled token itself).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Hashable, Sequence

from draftsmith.serve.core.costs import VerifyCosts
from draftsmith.serve.drafters.calibration import Calibration, generation_factor, scale_odds
from draftsmith.serve.drafters.leaves import Leaf, choose_leaves, leaf_gains
from draftsmith.serve.drafters.length_model import best_length, expected_tokens
from draftsmith.serve.drafters.pause import PauseRule
from draftsmith.serve.core.errors import DraftsmithError

Signal = tuple[Hashable, float]  # (calibration key, prior acceptance for that key)


class LengthPolicy:
    """How many tokens a cycle drafts. One instance per drafter; `start` opens a cycle, `offer` (step by step)
    or `choose` (whole proposal) decide, `observe` learns from the verification of the cycle's drafts."""

    name = "base"

    def __init__(self) -> None:
        self.cap = 0
        self.drafted = 0  # drafts kept this cycle
        # calibration keys of this cycle's drafts in order: the kept ones, then any the drafter looked at and
        # declined (their tokens are still compared with the target's when known)
        self.keys: list[Hashable] = []

    def start(self, cap: int, *, sampled: bool = False) -> None:
        self.cap, self.sampled, self.drafted, self.keys = cap, sampled, 0, []

    def new_context(self) -> None:
        """A new generation begins (the drafter's `begin`): forget what was learned about the last one's text."""

    def should_draft(self) -> bool:
        """Before any work: is this cycle worth running the drafter at all?"""
        return True

    def offer(self, signal: Signal) -> bool:
        """The next draft's signal is known (not yet sampled): draft it?"""
        raise NotImplementedError

    def wants_more(self) -> bool:
        """After an accepted offer: is another draft step worth computing?"""
        return self.drafted < self.cap

    def choose(self, signals: Sequence[Signal]) -> int:
        """A whole proposal's signals, in order: how many of its tokens to draft."""
        n = 0
        for signal in signals[: self.cap]:
            if not self.offer(signal):
                break
            n += 1
        return n

    def observe(self, matched: int, checked: int) -> None:
        """Of this cycle's `keys`, the first `matched` tokens equal the target's next tokens and `checked` could
        be compared (the one after the matched ones, if checked, differs). Also called for drafts the target did
        not verify (a hybrid's unused proposal): how they would have fared."""

    def leaves(self, candidates: Sequence[Leaf], *, limit: int) -> list[Leaf]:
        """Which runner-up drafts (serve/drafters/leaves.py) to hang off this cycle's greedy chain: none here."""
        return []

    def observe_leaves(self, leaves: Sequence[Leaf], matched: int, target_token: int | None) -> None:
        """The chain's first `matched` drafts were the target's tokens and `target_token` is the target's token at
        position matched + 1 (None: not known): the leaves at that depth were right iff they equal it."""

    def record_step(self, seconds: float) -> None:
        """Wall time of one draft step (what `c` measures)."""

    def record_overhead(self, seconds: float) -> None:
        """Wall time of the drafter's per-cycle work outside draft steps (catching up on committed tokens)."""

    def record_cycle(self, seconds: float, tokens: int, *, worked: bool) -> None:
        """Wall time of a whole cycle (drafting, verification) that produced `tokens`; worked=False: the drafter
        did nothing this cycle (the cycle was a plain step)."""


class FixedLength(LengthPolicy):
    """Always the cap (K, or fewer when the drafter has fewer): the classic fixed-K speculative decoding."""

    name = "fixed"

    def offer(self, signal: Signal) -> bool:
        if self.drafted >= self.cap:
            return False
        self.drafted += 1
        return True


class MinConfidence(LengthPolicy):
    """Draft while the draft's own confidence (the raw signal, e.g. its top-1 probability) >= a threshold."""

    name = "min_confidence"

    def __init__(self, threshold: float):
        super().__init__()
        self.threshold = threshold

    def offer(self, signal: Signal) -> bool:
        if self.drafted >= self.cap or signal[1] < self.threshold:
            return False
        self.drafted += 1
        return True


class ExpectedGain(PauseRule, LengthPolicy):
    """Draft while the expected rate E(n)/C(n) improves, with calibrated acceptance and measured costs; pause while
    the realized rate says the drafter does not pay (PauseRule, serve/drafters/pause.py).

    costs: the target's verify costs (or a function returning them, called on first use: measuring takes a
    second). c and o are measured as the drafter runs (seconds over the target's step); `step_cost` and
    `overhead_cost` set starting values in target steps. `explore`, `max_explore`, `trial`, `refresh` and
    `refresh_weight` are the pause rule's.

    The defaults, and why none depends on the traffic (none was fitted to a prompt set): each sets how fast an
    estimate follows evidence or how much trying costs, bounded by its own value, not by what the text is.
    - smoothing 0.1: the timing averages (c, o, the realized rate) weigh the last ~10 cycles; one cycle's wall time
      is noise (a page fault, a scheduler tick), ten average it out, and text changes over hundreds of tokens.
    - explore 8, max_explore 64, trial 4: a paused drafter is retried for 4 cycles after 8 paused ones, backing off
      to one trial per 64; a drafter that never pays thus works at most 4 cycles in 68 (6%), while one that pays
      again is noticed within 8 cycles. A cost bound and a reaction time, the same for any text.
    - refresh 32, refresh_weight 0.5: one plain cycle in 33 re-times the plain step (3% of cycles drafted nothing),
      so the reference follows the machine's speed, which drifts with load, not with the text.
    """

    name = "auto"

    def __init__(self, costs: VerifyCosts | Callable[[], VerifyCosts], *, step_cost: float = 0.0,
                 overhead_cost: float = 0.0, smoothing: float = 0.1, explore: int = 8, max_explore: int = 64,
                 trial: int = 4, local_weight: float = 0.0, generation_weight: float = 0.0, refresh: int = 32,
                 refresh_weight: float = 0.5):
        LengthPolicy.__init__(self)
        PauseRule.__init__(self, smoothing=smoothing, explore=explore, max_explore=max_explore, trial=trial,
                           refresh=refresh, refresh_weight=refresh_weight)
        self._costs = costs
        self.step_cost, self.overhead_cost = step_cost, overhead_cost
        self.calibration = {False: Calibration(), True: Calibration()}  # greedy / sampled drafts accept differently
        # the same within the current generation, with the pooled estimate as its prior, worth `local_weight` of
        # this generation's drafts of a key (0: the current generation is not used)
        self.local = {False: Calibration(prior_weight=local_weight, decay=1.0),
                      True: Calibration(prior_weight=local_weight, decay=1.0)}
        # the current generation's drafts over every key: [accepted, the pooled estimates' sum, tried], which scale
        # the pooled estimates' odds by `generation_factor` with `generation_weight` pseudo-drafts (0: not used)
        self.generation_weight = generation_weight
        self.generation = {False: [0.0, 0.0, 0.0], True: [0.0, 0.0, 0.0]}
        self.priors: list[float] = []  # the prior of each of this cycle's `keys`
        self._accept: list[float] = []
        self._more = False
        self._measured: set[str] = set()

    @property
    def costs(self) -> VerifyCosts:
        if callable(self._costs):
            self._costs = self._costs()
        return self._costs

    def use_costs(self, costs: VerifyCosts) -> None:
        """Weigh drafts against these costs from now on (the batched decoder: the costs at its current batch size)."""
        self._costs = costs

    def cost(self, n: int, nodes: int | None = None) -> float:
        """C(n) of a cycle drafting n tokens; `nodes`: the verify forward holds that many (a chain with leaves)."""
        return self.overhead_cost + n * self.step_cost + self.costs.ratio(n if nodes is None else nodes)

    def work_is_negligible(self) -> bool:
        # n-gram lookup: never worth pausing. 2% of a target step is below what one cycle's timing can resolve
        # (the decoder's own bookkeeping costs more), so pausing such a drafter could never be measured to pay
        return self.overhead_cost + self.step_cost < 0.02

    def measured_step_seconds(self) -> float:
        return self.costs.step_seconds

    @property
    def local_weight(self) -> float:
        return self.local[False].prior_weight

    @local_weight.setter
    def local_weight(self, weight: float) -> None:
        for table in self.local.values():
            table.prior_weight = weight

    def accept_probability(self, signal: Signal) -> float:
        return self.predict(self.sampled, *signal)

    def predict(self, sampled: bool, key: Hashable, prior: float) -> float:
        """P(accepted | key): the current generation's evidence shrunk towards every generation's, scaled by how the
        current generation's drafts of every key fared against it."""
        pooled = self.calibration[sampled].predict(key, prior)
        if self.generation_weight > 0:
            pooled = scale_odds(pooled, generation_factor(*self.generation[sampled], self.generation_weight))
        return self.local[sampled].predict(key, pooled) if self.local_weight > 0 else pooled

    def learn(self, sampled: bool, key: Hashable, accepted: bool, prior: float | None = None) -> None:
        """One verified draft of `key` (`prior`: the drafter's prior for it, where the generation's scale is kept)."""
        if self.generation_weight > 0 and prior is not None:
            tally = self.generation[sampled]
            tally[0] += float(accepted)
            tally[1] += self.calibration[sampled].predict(key, prior)
            tally[2] += 1.0
        self.calibration[sampled].update(key, accepted)
        if self.local_weight > 0:  # a head's policy (0) never reads the current generation's table
            self.local[sampled].update(key, accepted)

    def new_context(self) -> None:
        self.restart()
        for table in self.local.values():
            table.counts.clear()
        for tally in self.generation.values():
            tally[:] = [0.0, 0.0, 0.0]

    def start(self, cap: int, *, sampled: bool = False) -> None:
        super().start(cap, sampled=sampled)
        self._accept, self._more, self.priors = [], False, []

    def offer(self, signal: Signal) -> bool:
        n = len(self._accept)
        if n >= self.cap:
            return False
        a = self.accept_probability(signal)
        self.keys.append(signal[0])
        self.priors.append(signal[1])
        # keep this draft if some continuation through it (later drafts projected at the same acceptance) beats
        # stopping here; draft on only if the best such continuation is longer than this one token
        projected = self._accept + [a] * (self.cap - n)
        rates = [e / self.cost(i) for i, e in enumerate(expected_tokens(projected))]
        best = max(range(n + 1, len(rates)), key=lambda i: rates[i])
        if rates[best] <= rates[n]:
            return False
        self._accept.append(a)
        self.drafted += 1
        self._more = best > n + 1
        return True

    def wants_more(self) -> bool:
        return self._more and len(self._accept) < self.cap

    def choose(self, signals: Sequence[Signal]) -> int:
        accept = [self.accept_probability(s) for s in signals[: self.cap]]
        n, _ = best_length(accept, self.cost)
        self._accept = accept[:n]
        self.drafted, self.keys = n, [s[0] for s in signals[: self.cap]]
        self.priors = [s[1] for s in signals[: self.cap]]
        return n

    @property
    def kept(self) -> list[float]:
        """Acceptance probabilities of the drafts kept this cycle."""
        return list(self._accept)

    def observe(self, matched: int, checked: int) -> None:
        for i, key in enumerate(self.keys[: min(matched + 1, checked)]):
            # the generation's scale counts the drafts it decides about: the kept ones, not those declined
            prior = self.priors[i] if i < self.drafted else None  # priors holds every offered key: >= drafted
            self.learn(self.sampled, key, i < matched, prior)

    def leaves(self, candidates: Sequence[Leaf], *, limit: int) -> list[Leaf]:
        """The leaves that raise this cycle's expected rate, best first, for the chain kept this cycle (greedy: its
        b's are learned in the greedy table)."""
        chain = self._accept
        usable = [leaf for leaf in candidates if 1 <= leaf.depth <= len(chain)]
        if not usable or limit <= 0:
            return []
        gains = leaf_gains(chain, [(leaf.depth, self.predict(False, leaf.key, leaf.prior)) for leaf in usable])
        chosen = choose_leaves(expected_tokens(chain)[-1], len(chain), gains,
                               lambda nodes: self.cost(len(chain), nodes), limit=limit)
        return [usable[i] for i in chosen]

    def observe_leaves(self, leaves: Sequence[Leaf], matched: int, target_token: int | None) -> None:
        if target_token is None:
            return
        for leaf in leaves:
            if leaf.depth == matched + 1:
                self.learn(False, leaf.key, leaf.token == target_token)

    def record_step(self, seconds: float) -> None:
        self.step_cost = self._smooth("step", self.step_cost, seconds)

    def record_overhead(self, seconds: float) -> None:
        self.overhead_cost = self._smooth("overhead", self.overhead_cost, seconds)

    def _smooth(self, what: str, current: float, seconds: float) -> float:
        step = self.costs.step_seconds
        if not (math.isfinite(step) and step > 0):
            return current
        first = what not in self._measured
        self._measured.add(what)
        return seconds / step if first else current + self.smoothing * (seconds / step - current)


class Stopwatch:
    """`with watch: ...` adds the block's wall time to a policy's step or overhead estimate."""

    def __init__(self, record: Callable[[float], None]):
        self.record = record

    def __enter__(self) -> "Stopwatch":
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.record(time.perf_counter() - self.start)


def matched_prefix(proposed: Sequence[int], produced: Sequence[int]) -> int:
    """How many proposed drafts equal the tokens the cycle produced, in order: the accepted ones (a rejected
    draft never equals the token sampled in its place, which comes from a residual without it)."""
    n = 0
    for draft, token in zip(proposed, produced):
        if int(draft) != int(token):
            break
        n += 1
    return n


@dataclass
class LastDraft:
    """A drafter's last cycle, kept until the cycle's tokens are known so its policy can learn from them.

    tokens: the tokens of the policy's `keys` this cycle: the drafted ones, then those it looked at and declined
    where they are known without sampling (greedy drafts, an n-gram's continuation).
    started: when the drafter was asked for this cycle's draft (`open`); worked: whether it did any work for it.
    A cycle the drafter was not asked for (a hybrid used its other side) is not timed."""
    tokens: list[int] | None = None
    leaves: list[Leaf] = field(default_factory=list)  # candidate leaves (target ids) whose fate is learned from
    verified: bool = True  # False: proposed but not what the target verified (a hybrid used the other drafter)
    started: float | None = None
    worked: bool = False

    def open(self, policy: LengthPolicy, *, always: bool = False) -> bool:
        """At the start of `propose`: the cycle's clock starts. Returns whether the drafter works this cycle: not
        while its policy has it paused, unless `always` (a tree, whose shape no length policy chooses). A paused
        cycle opens as one of no drafts, so the policy's `kept` says this cycle's, not its last working one's."""
        self.started, self.worked = time.perf_counter(), always or policy.should_draft()
        if not self.worked:
            policy.start(0)
        return self.worked

    def settle(self, policy: LengthPolicy, next_tokens) -> int | None:
        """next_tokens: (m+1,) what the cycle produced. Observes, times and forgets the last cycle; returns how many
        of its tokens the cycle produced in order (None: it had none)."""
        produced = [int(t) for t in next_tokens]
        matched = None
        if self.tokens:
            matched = matched_prefix(self.tokens, produced)
            policy.observe(matched, min(len(produced), len(self.tokens)))
            if self.leaves:
                policy.observe_leaves(self.leaves, matched, produced[matched] if matched < len(produced) else None)
        if self.started is not None and self.verified:
            policy.record_cycle(time.perf_counter() - self.started, len(produced), worked=self.worked)
        self.tokens, self.leaves, self.verified, self.started, self.worked = None, [], True, None, False
        return matched


LENGTHS = ("auto", "fixed")


def build_policy(length: str = "auto", *, costs: VerifyCosts | Callable[[], VerifyCosts] | None = None,
                 min_confidence: float = 0.0, **gain_options) -> LengthPolicy:
    """`auto`: ExpectedGain over `costs`; `fixed`: always K; min_confidence > 0: MinConfidence (chains stop where
    the draft's top-1 probability falls below it)."""
    if not 0.0 <= min_confidence < 1.0:
        raise DraftsmithError(f"min_confidence must be in [0, 1), got {min_confidence}")
    if min_confidence > 0:
        return MinConfidence(min_confidence)
    if length == "fixed":
        return FixedLength()
    if length != "auto":
        raise DraftsmithError(f"length must be one of {', '.join(LENGTHS)}, got {length!r}")
    if costs is None:
        raise DraftsmithError("the auto length policy needs the target's verify costs")
    return ExpectedGain(costs, **gain_options)
