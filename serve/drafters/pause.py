"""Whether a drafter runs at all, decided from what its cycles really took (the length policy's pause rule).

Each cycle's wall time, from the start of drafting to the end of its verification, is set against the wall time of
a cycle in which the drafter did no work (a plain step). That realized rate covers what the length model leaves out
(the decoder's own work per cycle, a context longer than the one the costs were measured on, a machine busier than
then); a drafter whose cycles yield less than a plain step's one token per step's time pauses, and is retried ever
less often while it keeps not paying; each new request starts the back-off over with a trial. The plain cycle is
re-timed while the drafter works: after `refresh` working cycles in a row one cycle is left plain, so the reference
follows the machine's speed (docs/results.md, "Draft length per step", has the measurement).
"""
from __future__ import annotations

import math


class PauseRule:
    """The rate a drafter's working cycles realize, and when it pauses, retries and resumes (a mixin of the length
    policy, serve/drafters/length.py, which says what the drafter's work costs and how long a target step takes).

    A drafter whose realized rate falls below 1 pauses; it is retried after `explore` cycles, then after twice as
    many each time the retry does not pay, up to `max_explore`; the back-off is forgiven once the drafter has paid
    for as many cycles as it last waited. A retry is a trial of `trial` drafting cycles judged by their joint
    realized rate: one that paid resumes the drafter at that rate, one that did not pauses it at that rate. One
    cycle is too few to judge by: a one-cycle retry fails whenever its first draft is rejected, even for a drafter
    that pays on average, and one good cycle cannot lift a smoothed rate back above 1 either, so the trial's rate
    replaces the smoothed one. After `refresh` working cycles in a row (0: never) one cycle is left plain to re-time
    the plain step; that sample weighs `refresh_weight`, and the rate, measured against the old time, is rescaled to
    the new one.
    """

    def __init__(self, *, smoothing: float, explore: int, max_explore: int, trial: int, refresh: int,
                 refresh_weight: float):
        self.smoothing = smoothing
        self.explore, self.max_explore, self.trial = explore, max_explore, max(1, trial)
        self._idle, self._wait = 0, explore  # paused cycles so far, and how many before the next retry
        self._paying = 0  # cycles in a row at a rate of 1 or more
        self._trial_left, self._trial_tokens, self._trial_seconds = 0, 0, 0.0  # the trial under way, if any
        self.refresh, self.refresh_weight = refresh, refresh_weight
        self._since_plain, self._refreshing = 0, False  # working cycles since a plain one; this cycle re-times it
        # realized tokens per plain step's wall time over the cycles the drafter worked, smoothed (what decides
        # whether it runs, and what a hybrid compares drafters by); plain_seconds: a plain cycle's wall time
        self.rate = 1.0
        self.plain_seconds: float | None = None

    def work_is_negligible(self) -> bool:
        """A drafter whose work costs next to nothing always runs."""
        raise NotImplementedError

    def measured_step_seconds(self) -> float:
        """A 1-token target forward's seconds, standing in for a plain cycle until one has been timed."""
        raise NotImplementedError

    def should_draft(self) -> bool:
        """Skip the drafter's work while its realized rate is below a plain step's (1 token per step), but retry
        after `explore` paused cycles, twice as many after each retry that left it below; a drafter whose work
        is negligible (n-gram lookup) always runs, and so does one on trial."""
        if self._trial_left > 0:
            return True
        negligible = self.work_is_negligible()
        if self.refresh and self._since_plain >= self.refresh and not negligible:
            self._since_plain, self._refreshing = 0, True  # a plain cycle, timed as the reference again
            return False
        if self.rate >= 1.0 or negligible:
            self._idle, self._paying = 0, self._paying + 1
            if self._paying >= self._wait:
                self._wait = self.explore
            return True
        self._idle, self._paying = self._idle + 1, 0
        if self._idle >= self._wait:
            self._idle, self._wait = 0, min(2 * self._wait, self.max_explore)
            self.probe()
            return True
        return False

    def restart(self) -> None:
        """A new request begins: its text owes nothing to the last one's, so the back-off starts over and a paused
        drafter is put on trial at once. A rate learned on other requests' text would otherwise keep the drafter
        off a request where it pays (a head paused on chat stays paused through a following math answer); the
        trial costs at most `trial` cycles of a request on which it still does not pay."""
        self._idle, self._wait, self._paying = 0, self.explore, 0
        if self.rate < 1.0 and not self.work_is_negligible():
            self.probe()

    def probe(self) -> None:
        """Put the drafter on trial: it drafts the next `trial` cycles it is asked for, and their joint realized
        rate replaces its rate (a retry after a pause; a hybrid trying a head it has not used for a while)."""
        if self._trial_left == 0:
            self._trial_left, self._trial_tokens, self._trial_seconds = self.trial, 0, 0.0

    def record_cycle(self, seconds: float, tokens: int, *, worked: bool) -> None:
        if not (math.isfinite(seconds) and seconds > 0):
            return
        if not worked:
            before = self.plain_seconds
            weight = self.refresh_weight if self._refreshing else self.smoothing
            self.plain_seconds = seconds if before is None else before + weight * (seconds - before)
            if self._refreshing and before is not None:  # the rate was measured against the old time: rescale it
                self.rate *= self.plain_seconds / before
            self._since_plain, self._refreshing = 0, False
            return
        self._since_plain += 1
        # until a plain cycle has been timed, the 1-token forward measured with the costs stands in for one
        plain = self.plain_seconds if self.plain_seconds is not None else self.measured_step_seconds()
        if not (math.isfinite(plain) and plain > 0):
            return
        self.rate += self.smoothing * (tokens * plain / seconds - self.rate)
        if self._trial_left > 0:
            self._trial_left -= 1
            self._trial_tokens, self._trial_seconds = self._trial_tokens + tokens, self._trial_seconds + seconds
            if self._trial_left == 0:
                joint = self._trial_tokens * plain / self._trial_seconds
                self.rate = max(self.rate, joint) if joint >= 1.0 else joint
