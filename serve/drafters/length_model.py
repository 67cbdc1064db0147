"""The length policy's model of one cycle: E(n), the tokens a cycle yields if it keeps its first n drafts (bonus
included), and the n with the best rate E(n)/C(n) for a cost C(n) in target steps (serve/drafters/length.py)."""
from __future__ import annotations

from typing import Callable, Sequence


def expected_tokens(accept: Sequence[float]) -> list[float]:
    """a_1..a_n -> E(0..n): tokens a cycle yields if it keeps the first i drafts (bonus included)."""
    out, running, product = [1.0], 1.0, 1.0
    for a in accept:
        product *= a
        running += product
        out.append(running)
    return out


def best_length(accept: Sequence[float], cost: Callable[[int], float]) -> tuple[int, float]:
    """The n <= len(accept) with the best expected rate E(n)/C(n), and that rate (ties: the shorter)."""
    rates = [e / cost(n) for n, e in enumerate(expected_tokens(accept))]
    n = max(range(len(rates)), key=lambda i: (rates[i], -i))
    return n, rates[n]
