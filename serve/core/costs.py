"""What verification costs on this machine, measured on the target itself.

A target forward over n new tokens on a cached context costs more than a 1-token step by a factor that
depends on the hardware: ~1.4-2.1x for n = 2..8 on a 2-core CPU, ~1x on a GPU until the batch is
compute-bound. The draft-length policy (serve/drafters/length.py) weighs every draft token against it, and
eval's cost model (eval/cost_model.py) fits its predictions with the same numbers. Measured once per
process and model, in about 3 s on the default target, with the threads and device the decoder will run on.
"""
from __future__ import annotations

import statistics
import time
import weakref
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import torch

from draftsmith.serve.core.kv import cache_kwargs, new_cache, record_states, rollback

# Verify sizes measured by default (new tokens = drafted + 1); others are interpolated. 13: the width of a chain
# carrying leaves (serve/drafters/leaves.py), where the curve bends on a CPU.
DEFAULT_SIZES = (1, 2, 3, 4, 6, 9, 13, 17)
# At batch > 1 (serve/batch/costs.py) every row's forward grows together: fewer sizes, fewer rounds.
BATCH_SIZES = (1, 2, 3, 5, 9)

def verify_ratio_at(ratios: Mapping[int, float], k: int) -> float:
    """verify_ratio(K) from measured points: piecewise linear, linear extrapolation past the last two."""
    if k in ratios:
        return float(ratios[k])
    points = sorted(ratios.items())
    if not points:
        raise ValueError("no measured verify ratios")
    if len(points) == 1:
        return float(points[0][1])
    if k < points[0][0]:
        (k0, r0), (k1, r1) = points[0], points[1]
    elif k > points[-1][0]:
        (k0, r0), (k1, r1) = points[-2], points[-1]
    else:
        i = next(i for i, (kk, _) in enumerate(points) if kk > k)
        (k0, r0), (k1, r1) = points[i - 1], points[i]
    return r0 + (r1 - r0) * (k - k0) / (k1 - k0)


@dataclass(frozen=True)
class VerifyCosts:
    """ratios[n]: a forward over n drafted tokens + the pending one, over a 1-token step (ratios[0] = 1);
    step_seconds: that 1-token step."""
    ratios: Mapping[int, float] = field(default_factory=lambda: {0: 1.0})
    step_seconds: float = float("nan")

    def ratio(self, drafted: int) -> float:
        return 1.0 if drafted <= 0 else max(1.0, verify_ratio_at(self.ratios, drafted))

    @classmethod
    def from_forward_seconds(cls, seconds: Mapping[int, float]) -> "VerifyCosts":
        """seconds[n] = a forward over n new tokens (n = 1 required) -> the costs of drafting n - 1."""
        if 1 not in seconds:
            raise ValueError("verify costs need the 1-token forward time (key 1)")
        return cls(ratios={n - 1: t / seconds[1] for n, t in sorted(seconds.items())}, step_seconds=seconds[1])


def context_ids(vocab_size: int, context_tokens: int) -> torch.Tensor:
    """(1, T) token ids for a timing context; the content does not change the cost."""
    return (torch.arange(context_tokens) * 7919 % max(2, vocab_size - 1))[None]


@torch.inference_mode()
def forward_times(model, context: torch.Tensor, ns: Sequence[int], *, repeats: int = 5) -> dict[int, list[float]]:
    """Seconds of each repeat of a forward over n new tokens after `context` (KV-cached), for each n in `ns`;
    context (B, T): B rows, each n new tokens.

    The n's are interleaved across repeats so a noisy machine hits them alike; round 0 warms every shape up."""
    device = next(model.parameters()).device
    context = context.to(device)  # (B, T)
    length = context.shape[1]
    cache = new_cache(model)
    model(input_ids=context, logits_to_keep=1, **cache_kwargs(model, cache))
    times: dict[int, list[float]] = {n: [] for n in ns}
    for r in range(repeats + 1):
        for n in ns:
            new_ids = context[:, :n]  # (B, n)
            if device.type == "cuda":
                torch.cuda.synchronize()
            record_states(cache, n)  # what a verify forward on a hybrid target records to roll back
            start = time.perf_counter()
            model(input_ids=new_ids, **cache_kwargs(model, cache))  # all n logits, as a verify forward
            if device.type == "cuda":
                torch.cuda.synchronize()
            elapsed = time.perf_counter() - start
            rollback(cache, length)
            if r > 0:
                times[n].append(elapsed)
    return times


def measure_verify_costs(model, *, sizes: Sequence[int] = DEFAULT_SIZES, repeats: int = 4,
                         context_tokens: int = 256, batch: int = 1) -> VerifyCosts:
    """Time forwards over `sizes` new tokens on a `context_tokens` cache, interleaved; `batch` rows at once (the
    ratios are then V(n, B) / V(0, B): B rows drafting n each, over B rows' plain step). Each round's forwards are
    divided by that round's 1-token step and the median over rounds gives the ratio: a machine whose speed drifts
    (another process, a neighbour on a VM) moves a round's forwards together, so their ratio holds, where the
    fastest of each size can pair a lucky 1-token step with an unlucky wide forward. On a 2-core VM whose step time
    swung by 20%, three measurements of 16 drafts gave 1.41-1.74 steps with the fastest of 2 and 1.40-1.44 with
    the median of 4 rounds; a 30-round timing gave 1.51."""
    vocab = int(getattr(getattr(model.config, "text_config", None) or model.config, "vocab_size", 2))
    context = context_ids(vocab, context_tokens).repeat(batch, 1)  # (B, T)
    times = forward_times(model, context, sorted(set(sizes) | {1}), repeats=repeats)
    step = statistics.median(times[1])
    ratios = {n: statistics.median(t / one for t, one in zip(ts, times[1])) for n, ts in times.items()}
    # A forward over more tokens never costs less; a noisy round must not make drafting look free.
    running = 0.0
    for n in sorted(ratios):
        running = max(running, ratios[n])
        ratios[n] = running
    return VerifyCosts.from_forward_seconds({n: r * step for n, r in ratios.items()})

_MEASURED: "weakref.WeakKeyDictionary[torch.nn.Module, dict[tuple, VerifyCosts]]" = weakref.WeakKeyDictionary()


def _costs_key(model, batch: int) -> tuple:
    param = next(model.parameters())
    return str(param.device), param.dtype, torch.get_num_threads(), batch


def verify_costs_for(model, batch: int = 1) -> VerifyCosts:
    """The verify costs of `model` on its device and dtype with the current torch thread count, `batch` rows at
    once, measured on first use in this process (or set by `use_verify_costs`)."""
    per_model = _MEASURED.setdefault(model, {})
    key = _costs_key(model, batch)
    if key not in per_model:
        per_model[key] = measure_verify_costs(model) if batch == 1 else \
            measure_verify_costs(model, sizes=BATCH_SIZES, repeats=2, context_tokens=128, batch=batch)
    return per_model[key]


def use_verify_costs(model, costs: VerifyCosts, batch: int = 1) -> None:
    """Make `verify_costs_for(model, batch)` return `costs` on the current device, dtype and thread count, instead
    of what it measures (a policy comparison on fixed costs: scripts/bench/policy_sim.py --costs)."""
    _MEASURED.setdefault(model, {})[_costs_key(model, batch)] = costs
