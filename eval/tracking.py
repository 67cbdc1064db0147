"""Optional wandb logging of an evaluation: the summary numbers, a per-domain table and the plots.

Honours WANDB_MODE (set WANDB_MODE=offline on machines without network)."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from draftsmith.eval.report import to_jsonable


def summary_metrics(result: dict) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, b in result["overall"].items():
        for key in ("mu", "speedup", "tokens_per_second", "baseline_tokens_per_second"):
            out[f"{name}/{key}"] = b[key]
        for domain, per in result["domains"].items():
            out[f"{name}/{domain}/mu"] = per[name]["mu"]
            out[f"{name}/{domain}/speedup"] = per[name]["speedup"]
    for name, p in (result.get("peers") or {}).items():
        out[f"peers/{name}/speedup"] = p["speedup"]
    ex = result["exactness"]
    if ex.get("checked"):
        out["exactness/identical"] = ex["identical"]
        out["exactness/total"] = ex["total"]
    return {k: v for k, v in to_jsonable(out).items() if v is not None}


def log_to_wandb(result: dict, plots: Sequence[Path], *, project: str = "draftsmith", name: str | None = None,
                 directory: str | Path | None = None) -> str:
    """Log one evaluation as a wandb run; returns the run's id."""
    import wandb

    run = wandb.init(project=project, job_type="eval", name=name, dir=str(directory) if directory else None,
                     config=to_jsonable({"target": result["target"], **result["settings"]}))
    try:
        rows = [[d, n, b["prompts"], b["mu"], b["speedup"], b["tokens_per_second"]]
                for d, per in result["domains"].items() for n, b in per.items()]
        table = wandb.Table(columns=["domain", "drafter", "prompts", "mu", "speedup", "tokens_per_second"],
                            data=to_jsonable(rows))
        run.log({"domains": table, **{f"plots/{Path(p).stem}": wandb.Image(str(p)) for p in plots}})
        run.summary.update(summary_metrics(result))
        return run.id
    finally:
        run.finish()
