"""When speculative decoding pays: the cost model of Leviathan et al. with measured costs.

Time unit: one target forward over 1 token on a cached context (a plain decoding step).
One cycle costs K·c (K draft steps of relative cost c) plus verify_ratio(K) (a target forward over
K+1 tokens) and yields E[tokens] = (1 − α^(K+1)) / (1 − α) when each draft token is accepted with
probability α independently. Speedup over plain decoding = E[tokens] / (K·c + verify_ratio(K)).
(Leviathan et al. 2023, https://arxiv.org/abs/2211.17192, eq. 1 and theorem 3.8, with the
verify cost measured instead of assumed to be 1.)
"""
from __future__ import annotations

from typing import Mapping, Sequence

from draftsmith.serve.core.costs import VerifyCosts, verify_ratio_at


def tokens_per_cycle(alpha: float, k: int) -> float:
    """Expected tokens per cycle (μ, bonus included) for per-token acceptance rate alpha."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def alpha_from_mu(mu: float, k: int, *, tol: float = 1e-9) -> float:
    """The alpha whose expected tokens per cycle at this K equal the measured μ (bisection).

    μ is clamped to [1, K+1], the range the formula can produce.
    """
    if k <= 0 or mu <= 1.0:
        return 0.0
    if mu >= k + 1:
        return 1.0
    lo, hi = 0.0, 1.0
    while hi - lo > tol:
        mid = (lo + hi) / 2
        if tokens_per_cycle(mid, k) < mu:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def verify_ratios(forward_seconds: Mapping[int, float]) -> dict[int, float]:
    """forward_seconds[n] = time of a target forward over n new tokens -> {K: t(K+1) / t(1)} (the decoder's
    VerifyCosts, serve/core/costs.py)."""
    return dict(VerifyCosts.from_forward_seconds(forward_seconds).ratios)


def draft_step_cost(draft_seconds: float, cycles: int, k: int, step_seconds: float) -> float:
    """c: the measured time of one draft step (a cycle's draft time / K) over a target step."""
    if cycles <= 0 or k <= 0 or step_seconds <= 0:
        return float("nan")
    return draft_seconds / (cycles * k) / step_seconds


def predicted_speedup(mu: float, k: int, c: float, verify_ratio: float) -> float:
    """Speedup from a measured μ: tokens per cycle over the cycle's cost in target steps."""
    return mu / (k * c + verify_ratio)


def mean_cycle_cost(drafted: Sequence[int], c: float, ratios: Mapping[int, float]) -> float:
    """Mean cost of a cycle in target steps when cycle j drafted d_j tokens: mean(d_j·c + verify_ratio(d_j)).

    Drafters that sometimes propose fewer than K tokens (n-gram without a match) verify fewer tokens;
    charging them K·c + verify_ratio(K) would under-predict their speedup.
    """
    if not drafted:
        return float("nan")
    return sum(d * c + verify_ratio_at(ratios, d) for d in drafted) / len(drafted)


def predicted_speedup_at(alpha: float, k: int, c: float, ratios: Mapping[int, float], *,
                         empty_share: float = 0.0) -> float:
    """Speedup at any K for acceptance rate alpha (the extrapolation used to pick K).

    empty_share: the share of cycles where the drafter proposes nothing (an n-gram drafter without a match);
    such a cycle is a plain step (one token for one target forward) whatever K is.
    """
    tokens = empty_share + (1 - empty_share) * tokens_per_cycle(alpha, k)
    cost = empty_share + (1 - empty_share) * (k * c + verify_ratio_at(ratios, k))
    return tokens / cost


def best_k(alpha: float, c: float, ratios: Mapping[int, float], ks: Sequence[int], *,
           empty_share: float = 0.0) -> dict[str, object]:
    """The K in `ks` that maximizes predicted speedup; `pays` says whether it beats plain decoding."""
    curve = {k: predicted_speedup_at(alpha, k, c, ratios, empty_share=empty_share) for k in ks}
    k = max(curve, key=lambda kk: curve[kk])
    return {"k": k, "predicted_speedup": curve[k], "pays": curve[k] > 1.0}


def drafting_cycles(accepted: Sequence[int], drafted: Sequence[int], k: int) -> tuple[float, float]:
    """(share of cycles that drafted nothing, mean tokens per cycle over the cycles that drafted all K).

    Cycles cut short (the last ones of a generation, a lookup that found fewer than K tokens) would bias
    alpha low; when no cycle drafted K, every cycle that drafted something is used.
    """
    if not drafted:
        return 0.0, float("nan")
    full = [a + 1 for a, d in zip(accepted, drafted) if d >= k]
    some = [a + 1 for a, d in zip(accepted, drafted) if d > 0]
    empty = 1 - len(some) / len(drafted)
    produced = full or some
    return empty, (sum(produced) / len(produced) if produced else 1.0)


def drafter_cost_model(*, k: int, c: float, ratios: Mapping[int, float], mu_by_domain: Mapping[str, float],
                       measured_by_domain: Mapping[str, float], ks: Sequence[int],
                       cycles_by_domain: Mapping[str, tuple[Sequence[int], Sequence[int]] | None] | None = None,
                       ) -> dict[str, object]:
    """The cost-model block of one drafter: per domain alpha, predicted vs measured speedup, best K.

    cycles_by_domain: per domain (accepted, drafted) tokens per cycle, when known. Then the prediction at the
    run's K divides the measured μ by the mean measured cycle cost, and the extrapolation over K treats cycles
    that drafted nothing as plain steps, with alpha fitted to the cycles that drafted K. Without them, every
    cycle is assumed to draft K tokens and alpha is fitted to μ.
    """
    vr = verify_ratio_at(ratios, k)
    domains: dict[str, object] = {}
    for domain, m in mu_by_domain.items():
        cycles = (cycles_by_domain or {}).get(domain)
        if cycles and cycles[1]:
            accepted, drafted = cycles
            empty, per_drafting_cycle = drafting_cycles(accepted, drafted, k)
            alpha, cost = alpha_from_mu(per_drafting_cycle, k), mean_cycle_cost(drafted, c, ratios)
        else:
            empty, alpha, cost = 0.0, alpha_from_mu(m, k), k * c + vr
        domains[domain] = {
            "alpha": alpha,
            "empty_draft_share": empty,
            "mu": m,
            "cycle_cost": cost,
            "predicted_speedup": m / cost,
            "measured_speedup": measured_by_domain.get(domain, float("nan")),
            "predicted_speedup_by_k": {kk: predicted_speedup_at(alpha, kk, c, ratios, empty_share=empty)
                                       for kk in ks},
            "best_k": best_k(alpha, c, ratios, ks, empty_share=empty),
        }
    return {"c": c, "k": k, "verify_ratio": vr, "domains": domains}
