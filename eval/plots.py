"""The report's PNG figures (matplotlib, Agg backend). Each function takes the OUT.json dict (as returned by
`evaluate` or read back from disk) and a path, and returns the path, or None when the run has no data for it."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from draftsmith.serve.core.files import atomic_path  # noqa: E402


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def _names(result: dict) -> list[str]:
    return [d["name"] for d in result["drafters"]]


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120, format=path.suffix.lstrip(".") or "png")
    plt.close(fig)
    return path


def mu_per_domain(result: dict, path: Path) -> Path | None:
    domains = list(result["domains"])
    names = _names(result)
    if not domains:
        return None
    fig, ax = plt.subplots(figsize=(max(5, 1.4 * len(domains) + 2), 3.6))
    width = 0.8 / max(1, len(names))
    for j, name in enumerate(names):
        xs = [i + (j - (len(names) - 1) / 2) * width for i in range(len(domains))]
        ys = [result["domains"][d][name]["mu"] or 0.0 for d in domains]
        bars = ax.bar(xs, ys, width, label=name)
        ax.bar_label(bars, fmt="%.2f", fontsize=7)
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xticks(range(len(domains)), domains)
    ax.set_ylabel("μ (tokens per target forward)")
    ax.set_title(f"μ per domain, K={result['settings']['k']}, T={result['settings']['temperature']}")
    ax.legend(fontsize=8)
    return _save(fig, path)


def acceptance_by_position(result: dict, path: Path) -> Path | None:
    names = _names(result)
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    drawn = False
    for name in names:
        rates = result["overall"][name]["acceptance_by_position"]
        xs = [i + 1 for i, r in enumerate(rates) if _finite(r)]
        ys = [r for r in rates if _finite(r)]
        if xs:
            ax.plot(xs, ys, marker="o", label=name)
            drawn = True
    if not drawn:
        plt.close(fig)
        return None
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("draft position i")
    ax.set_ylabel("P(accept i | 1..i-1 accepted)")
    ax.set_title("Acceptance by position (all prompts)")
    ax.legend(fontsize=8)
    return _save(fig, path)


def _sweep(result: dict, axis: str) -> list[dict]:
    return (result.get("sweeps") or {}).get(axis) or []


def speedup_vs_k(result: dict, path: Path) -> Path | None:
    """Measured speedup per K (from a k sweep, and the main run) and the cost model's predicted curve."""
    names = _names(result)
    cost = result.get("cost_model") or {}
    sweep = _sweep(result, "k")
    if not cost and not sweep:
        return None
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for j, name in enumerate(names):
        color = colors[j % len(colors)]
        model = (cost.get("drafters") or {}).get(name)
        if model:
            curve = model["overall"]["predicted_speedup_by_k"]
            ks = sorted(int(k) for k in curve)
            ax.plot(ks, [curve[k] if k in curve else curve[str(k)] for k in ks], ls="--", color=color,
                    label=f"{name} predicted")
        points = {p["value"]: p["overall"][name]["speedup"] for p in sweep}
        points.setdefault(result["settings"]["k"], result["overall"][name]["speedup"])
        ks = sorted(points)
        ax.plot(ks, [points[k] for k in ks], marker="o", color=color, ls="-" if len(ks) > 1 else "",
                label=f"{name} measured")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xlabel("K (draft tokens per cycle)")
    ax.set_ylabel("speedup over plain decoding")
    ax.set_title("Speedup vs K")
    ax.legend(fontsize=7)
    return _save(fig, path)


def mu_vs_temperature(result: dict, path: Path) -> Path | None:
    sweep = _sweep(result, "temperature")
    if not sweep:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for name in _names(result):
        ts = [p["value"] for p in sweep]
        axes[0].plot(ts, [p["overall"][name]["mu"] for p in sweep], marker="o", label=name)
        axes[1].plot(ts, [p["overall"][name]["speedup"] for p in sweep], marker="o", label=name)
    axes[0].set_ylabel("μ")
    axes[1].set_ylabel("speedup")
    axes[1].axhline(1.0, color="grey", lw=0.8)
    for ax in axes:
        ax.set_xlabel("temperature")
        ax.legend(fontsize=8)
    fig.suptitle(f"μ and speedup vs temperature, K={result['settings']['k']}")
    return _save(fig, path)


def predicted_vs_measured(result: dict, path: Path) -> Path | None:
    cost = result.get("cost_model") or {}
    pts = [(name, d, b["predicted_speedup"], b["measured_speedup"])
           for name, model in (cost.get("drafters") or {}).items() for d, b in model["domains"].items()
           if _finite(b["predicted_speedup"]) and _finite(b["measured_speedup"])]
    if not pts:
        return None
    fig, ax = plt.subplots(figsize=(4.8, 4.2))
    for name in dict.fromkeys(p[0] for p in pts):
        sel = [p for p in pts if p[0] == name]
        ax.scatter([p[2] for p in sel], [p[3] for p in sel], label=name)
        for _, d, x, y in sel:
            ax.annotate(d, (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
    lo = min(min(p[2], p[3]) for p in pts) * 0.9
    hi = max(max(p[2], p[3]) for p in pts) * 1.1
    ax.plot([lo, hi], [lo, hi], color="grey", lw=0.8, ls="--")
    ax.set_xlabel("predicted speedup (cost model)")
    ax.set_ylabel("measured speedup")
    ax.set_title("Cost model: predicted vs measured")
    ax.legend(fontsize=8)
    return _save(fig, path)


def speedup_vs_batch(result: dict, path: Path) -> Path | None:
    """Measured speedup per batch size (each against the faster plain decoder at that batch), with the cost model's
    predicted curve dashed."""
    sweep = _sweep(result, "batch_size")
    if not sweep:
        return None
    crossover = result.get("batch_crossover") or {}
    fig, ax = plt.subplots(figsize=(5.6, 3.8))
    for name in _names(result):
        sizes = [p["value"] for p in sweep]
        line, = ax.plot(sizes, [p["overall"][name]["speedup"] for p in sweep], marker="o", label=f"{name} measured")
        predicted = (crossover.get(name) or {}).get("predicted_speedup") or {}
        if predicted:
            ax.plot(sizes, [predicted.get(str(b), predicted.get(b, float("nan"))) for b in sizes], ls="--",
                    color=line.get_color(), label=f"{name} predicted")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size (rows decoded together)")
    ax.set_ylabel("speedup over batched plain decoding")
    ax.set_title("Speedup vs batch size")
    ax.legend(fontsize=7)
    return _save(fig, path)


PLOTS = {
    "mu_per_domain.png": mu_per_domain,
    "acceptance_by_position.png": acceptance_by_position,
    "speedup_vs_k.png": speedup_vs_k,
    "mu_vs_temperature.png": mu_vs_temperature,
    "predicted_vs_measured.png": predicted_vs_measured,
    "speedup_vs_batch.png": speedup_vs_batch,
}


def write_plots(result: dict, out_dir: str | Path) -> list[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for filename, fn in PLOTS.items():
        p = fn(result, out / filename)
        if p is not None:
            written.append(p)
    return written
