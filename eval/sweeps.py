"""Sweeps: the same evaluation re-run with one decoding setting varied (`k=1,2,3,5,8`,
`temperature=0,0.7,1.0,1.3`, `max_new_tokens=16,64,256`, ...), each point interleaved with its own
plain baseline. The evidence behind "speculation loses at high temperature / tiny outputs".
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Sequence

from draftsmith.eval import runner
from draftsmith.eval.batch_sweep import batch_point, crossovers
from draftsmith.eval.config import EvalConfig
from draftsmith.eval.sweep_axes import parse_sweeps
from draftsmith.serve.core.target import Target

_POINT_KEYS = ("prompts", "mu", "acceptance_by_position", "tokens_per_second", "baseline_tokens_per_second",
               "speedup", "speedup_spread")


def _point(domains: dict, overall: dict, names: Sequence[str], exactness: dict) -> dict[str, Any]:
    return {"overall": {n: {key: overall[n][key] for key in _POINT_KEYS} for n in names},
            "domains": {d: {n: {key: domains[d][n][key] for key in ("mu", "speedup", "tokens_per_second")}
                            for n in names} for d in domains},
            "exactness": exactness}


def run_sweeps(target: Target, entries: Sequence[Any], prompts: Sequence[Any], config: EvalConfig, *,
               base: dict | None = None) -> dict[str, list[dict]]:
    """axis -> one point per value: per drafter overall and per-domain μ and speedup.

    The point equal to the main run's settings is taken from `base` instead of being re-run. A batch_size point
    above 1 runs the batched decoders (eval/batch_sweep.py) and also says which plain decoder it was measured
    against.
    """
    names = [e.name for e in entries]
    main = runner.Decoding.from_config(config)
    out: dict[str, list[dict]] = {}
    for axis, values in parse_sweeps(config.sweep):
        points = []
        for value in values:
            decoding = main if axis == "batch_size" else replace(main, **{axis: value})
            if axis == "batch_size" and value > 1:
                domains, overall, names, exactness, plain = batch_point(target, entries, prompts, main, config,
                                                                        value)
                point = {**_point(domains, overall, names, exactness), "plain": plain}
            elif decoding == main and base is not None:
                point = _point(base["domains"], base["overall"], names, base["exactness"])
            else:
                records = runner.run_methods(target, entries, [], prompts, decoding, warmup=False,
                                             progress=config.progress, repeats=config.repeats,
                                             desc=f"sweep {axis}={value}")
                runner.mark_exactness(records, names)
                domains, overall = runner.summarize_methods(records, names, prompts, k=decoding.k, config=config)
                point = _point(domains, overall, names,
                               runner.exactness_block(records, names, decoding.temperature, target=target,
                                                      top_k=decoding.top_k, top_p=decoding.top_p))
            points.append({"value": value, **point})
        out[axis] = points
    return out


def batch_crossover(target: Target, result: dict) -> dict[str, dict] | None:
    """Per drafter, the predicted and measured crossover batch of the result's batch_size sweep (None: none)."""
    from draftsmith.serve.core.costs import verify_costs_for

    points = (result.get("sweeps") or {}).get("batch_size")
    if not points:
        return None
    names = list(points[0]["overall"])
    return crossovers(points, names, result["overall"], result["records"], lambda b: verify_costs_for(target.model, b))
