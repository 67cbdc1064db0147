"""Which drafter won, per domain: the best measured speedup of the run, with its draft-length policy, its μ and
what the cost model predicted for it, beside the runner-up. A pure function of the result's blocks."""
from __future__ import annotations

import math
from typing import Any

from draftsmith.serve.methods.registry import has


def _predicted(result: dict, name: str, domain: str) -> float:
    cost = (result.get("cost_model") or {}).get("drafters", {}).get(name)
    if not cost:
        return float("nan")
    block = cost["overall"] if domain == "overall" else cost["domains"].get(domain, {})
    return float(block.get("predicted_speedup", float("nan")))


def winners(result: dict) -> dict[str, dict[str, Any]]:
    """domain (and "overall") -> {drafter, length, speedup, predicted_speedup, mu, runner_up, runner_up_speedup,
    tie}. The oracle is a ceiling, not a drafter one can deploy: it never wins. `tie`: the runner-up is closer than
    the run's resolution (`settings.timing_spread`, the median spread of repeated timings; only with --repeats)."""
    lengths = (result.get("settings") or {}).get("draft_length") or {}
    resolution = (result.get("settings") or {}).get("timing_spread")
    ceilings = {d["name"] for d in result.get("drafters", []) if has(d.get("kind", ""), "ceiling")}
    out: dict[str, dict[str, Any]] = {}
    for domain, per in list(result["domains"].items()) + [("overall", result["overall"])]:
        ranked = sorted((n for n in per if n not in ceilings), key=lambda n: -_finite(per[n]["speedup"]))
        if not ranked:
            continue
        best = ranked[0]
        second = ranked[1] if len(ranked) > 1 else None
        out[domain] = {"drafter": best, "length": lengths.get(best, "fixed"), "speedup": per[best]["speedup"],
                       "predicted_speedup": _predicted(result, best, domain), "mu": per[best]["mu"],
                       "runner_up": second, "runner_up_speedup": per[second]["speedup"] if second else float("nan"),
                       "tie": second is not None and _tie(per[best]["speedup"], per[second]["speedup"], resolution)}
    return out


def _tie(best: Any, second: Any, resolution: Any) -> bool:
    """The runner-up's speedup within `resolution` (a relative spread) of the best; never without a resolution."""
    values = [_finite(v) for v in (best, second, resolution)]
    return all(math.isfinite(v) for v in values) and values[1] * (1 + values[2]) >= values[0]


def _finite(x: Any) -> float:
    return float(x) if isinstance(x, (int, float)) and math.isfinite(x) else float("-inf")
