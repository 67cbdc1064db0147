"""Seeded sampling that does not depend on how the tokens were decoded: the randomness of output position t is
drawn from (seed, t), never from a stream.

A stream of random numbers gives a seeded request one answer only while every decode draws the same count of
numbers in the same order; speculation does not (the drafts per cycle follow the length policy's timing, a batch's
width follows its neighbours), so the same seed gave different texts alone, in a batch, with or without drafts.
Here the token at output position t is the Gumbel-max draw

    token_t = argmax_v (log p_t(v) + G_t(v)),   G_t(v) = -log(-log U_t(v)),   U_t ~ U(0, 1)^V from key(seed, t)

an exact sample from p_t (the Gumbel-max trick), with noise fixed by the seed and the position alone. Plain
decoding emits token_t; speculative decoding follows the draft node equal to token_t at each verified position and
emits token_t where none is: token for token what plain seeded decoding emits, whatever was drafted. A
deterministic draft d is accepted with probability p_t(d), as rejection sampling accepts it; a drafter that samples
draws with the same noise (`DraftDraws`), so its draft equals the target's token as often as the two distributions
let the shared noise couple them (about sum_v min(p, q), a little under the rejection sampler's for sampled chains).
"""
from __future__ import annotations

import torch

from draftsmith.serve.core.sampling import process_logits

_MASK = (1 << 64) - 1


def position_key(seed: int, position: int) -> int:
    """A 63-bit generator seed for (seed, position): splitmix64 of both, so nearby seeds and positions share
    nothing. seed: any int a request may carry (negative too)."""
    z = ((seed & _MASK) ^ ((position + 1) * 0x9E3779B97F4A7C15)) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return (z ^ (z >> 31)) >> 1


def gumbel(seed: int, position: int, vocab: int) -> torch.Tensor:
    """(vocab,) float64 standard Gumbel noise of output position `position` under `seed`."""
    u = torch.rand(vocab, generator=torch.Generator().manual_seed(position_key(seed, position)), dtype=torch.float64)
    return -torch.log(-torch.log(u.clamp_min(torch.finfo(torch.float64).tiny)))


def gumbel_max(scores: torch.Tensor, noise: torch.Tensor) -> int:
    """(V,) log-probabilities up to a constant (-inf where excluded), (V,) Gumbel noise -> the token drawn."""
    return int((scores.double().cpu() + noise).max(-1).indices)


class PositionNoise:
    """A seeded request's randomness: the Gumbel noise of each output position (a few recent positions kept, as
    the target and the drafter read the same ones in a cycle)."""

    KEEP = 64

    def __init__(self, seed: int):
        self.seed = int(seed)
        self._noise: dict[tuple[int, int], torch.Tensor] = {}

    def at(self, position: int, vocab: int) -> torch.Tensor:
        """(vocab,) the noise of output position `position` (0: the first generated token)."""
        key = (position, vocab)
        if key not in self._noise:
            if len(self._noise) >= self.KEEP:
                self._noise.pop(next(iter(self._noise)))
            self._noise[key] = gumbel(self.seed, position, vocab)
        return self._noise[key]

    def token(self, logits: torch.Tensor, position: int, **probs) -> int:
        """(V,) raw logits -> the token at output position `position` under temperature/top-k/top-p `probs`
        (temperature > 0): plain seeded decoding's token, and the one speculation must reproduce."""
        return gumbel_max(process_logits(logits, **probs), self.at(position, logits.shape[-1]))

    def draws(self, position: int) -> "DraftDraws":
        """The noise a drafter samples its chain with when its first draft guesses output position `position`."""
        return DraftDraws(self, position)


class DraftDraws:
    """Passed to `Drafter.propose` as its generator: the i-th token a chain samples (serve/core/sampling.sample)
    draws with the noise of position start + i, the one the target's own token there is drawn with. Which noise a
    drafter uses never changes the output (the verdict reads only the target's tokens); sharing it makes its
    sampled drafts agree with the target's tokens more often."""

    def __init__(self, noise: PositionNoise, start: int):
        self.noise, self.next = noise, start

    def draw(self, probs: torch.Tensor, vocab: int | None = None, ids: torch.Tensor | None = None) -> int:
        """(Vd,) probabilities -> an index into them. vocab: the target's vocabulary (default Vd); ids: (Vd,) the
        target ids of the entries when they are a reduced draft vocabulary, None when they are the target's own."""
        noise = self.noise.at(self.next, vocab or probs.shape[-1])
        self.next += 1
        return gumbel_max(probs.double().cpu().log(), noise[ids.cpu()] if ids is not None else noise)
