"""Recipe ablation: the same data at the same budget, one change per row, results side by side.

    python scripts/bench/ablate.py configs/ablations/eagle3-cpu.yaml [--only base,lr-3e-4] [--decode PROMPTS ...
        [--decode-with ngram]]
        [key=value ...]

The YAML names a training recipe, overrides every row shares (the data, the held-out set, the budget) and the
rows, each a list of overrides that differ from the shared ones:

    recipe: configs/smollm2-135m/eagle3.yaml
    out_dir: runs/ablate/eagle3
    overrides: [data.mode=offline, data.cache=runs/cache/train, data.eval_cache=runs/cache/held, optim.epochs=3]
    rows:
      base: []
      lr-3e-4: [optim.lr=3e-4]

Each row trains into OUT_DIR/ROW (a finished row whose resolved config is unchanged is reused, so rows can be
added to a table), evaluating held-out agreement every log.eval_every steps. The table gives, per row: steps, the
training tokens seen, wall seconds and tokens per CPU-second (throughput on a busy machine), held-out top-1
agreement at drafted positions 1..K and train agreement at position 1 at the best evaluation, and mu_tf (the
K-chain's accepted length estimated teacher-forced on the held-out rows). With --decode, every row's drafter also
decodes the held-out prompts in one interleaved `draftsmith eval` run beside plain decoding and the n-gram drafter
(--decode-with): real μ, speedup, and the count of outputs identical to plain greedy decoding.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ROW_RECORD = "ablation_row.json"


def load_plan(path: Path) -> dict:
    import yaml

    plan = yaml.safe_load(path.read_text())
    if not isinstance(plan, dict) or not isinstance(plan.get("rows"), dict) or "recipe" not in plan:
        sys.exit(f"ablate: {path} needs `recipe`, `rows` (name: [overrides]) and optionally `overrides`, `out_dir`")
    return plan


def row_config(plan: dict, name: str, extra: list[str]):
    from draftsmith.serve.core.config import load_config, to_dict
    from draftsmith.train.config import TrainConfig, check

    out_dir = Path(plan.get("out_dir", "runs/ablate")) / name
    overrides = [*plan.get("overrides", []), *(plan["rows"][name] or []), *extra, f"out_dir={out_dir}",
                 "log.progress=false"]
    config = check(load_config(TrainConfig, config_file=ROOT / plan["recipe"] if not Path(plan["recipe"]).is_file()
                               else plan["recipe"], overrides=overrides))
    return config, to_dict(config)


def train_row(config, resolved: dict) -> Path:
    """Train unless this exact config already finished here."""
    from draftsmith.train.run import train_drafter

    out = Path(config.out_dir)
    record = out / ROW_RECORD
    if record.is_file() and json.loads(record.read_text()) == resolved and (out / "drafter" / "config.json").is_file():
        print(f"[ablate] {out.name}: reusing {out / 'drafter'}", flush=True)
        return out / "drafter"
    if out.exists():  # another config, or an interrupted run of another config: start clean
        import shutil

        if record.is_file() and json.loads(record.read_text()) != resolved:
            shutil.rmtree(out)
    drafter = train_drafter(config)
    record.write_text(json.dumps(resolved, indent=1))
    return drafter


def summarize(out_dir: Path) -> dict:
    """The row's figures from its training log: the best held-out evaluation and the run's cost."""
    from draftsmith.train.tracking import read_log

    log = read_log(out_dir)
    evals = [r for r in log if r.get("event") == "eval" and r.get("trained")]
    if not evals:
        sys.exit(f"ablate: {out_dir} has no held-out evaluation (set data.eval_rows or data.eval_cache)")
    best = max(evals, key=lambda r: r["mu_tf"])
    steps = [r for r in log if "tokens_per_s" in r]
    start = next(r for r in log if r.get("event") == "start")
    tokens = sum(r["tokens"] for r in steps)
    seconds = sum(r["step_seconds"] * (r["step"] - prev) for prev, r in zip([0] + [s["step"] for s in steps], steps))
    summary = json.loads((out_dir / "drafter" / "training_summary.json").read_text())
    return {"best_step": best["step"], "steps": max((r["step"] for r in log), default=0),
            "train_tokens": summary["train_tokens"], "token_epochs": summary["token_epochs"],
            "total_steps": start["total_steps"], "tokens": int(tokens), "train_seconds": round(seconds, 1),
            "tokens_per_cpu_s": round(sum(r["tokens_per_cpu_s"] for r in steps) / max(len(steps), 1), 1),
            "agreement": best["agreement"], "train_agreement": best.get("train_agreement", []),
            "mu_tf": best["mu_tf"], "curve": [(r["step"], r["mu_tf"], r["agreement"][0]) for r in evals]}


def decode(plan: dict, drafters: dict[str, Path], argv: list[str]) -> dict:
    """One interleaved `draftsmith eval` run of every row's drafter beside plain decoding."""
    from draftsmith.eval.config import EvalConfig
    from draftsmith.eval.evaluate import evaluate
    from draftsmith.serve.core.config import load_config
    from draftsmith.serve.core.target import load_target

    parser = argparse.ArgumentParser(prog="ablate --decode")
    parser.add_argument("--decode", action="append", required=True, help="held-out prompt source (repeatable)")
    parser.add_argument("--decode-limit", type=int, default=4, help="prompts per domain")
    parser.add_argument("--decode-tokens", type=int, default=96)
    parser.add_argument("--decode-with", action="append", default=None,
                        help="drafters decoded beside the rows' (spec; repeatable; default: ngram, the free baseline "
                             "a trained drafter must beat)")
    parser.add_argument("--target", default="demo")
    args, _ = parser.parse_known_args(argv)
    k = int(plan.get("decode_k", 5))
    config = load_config(EvalConfig, overrides=[f"k={k}", f"max_new_tokens={args.decode_tokens}",
                                                f"limit={args.decode_limit}", "peers=false", "hf_plain=false",
                                                "cost_model=false", "threads=1"])
    target = load_target(args.target)
    specs = {name: str(path) for name, path in drafters.items()}
    specs.update({spec: spec for spec in (args.decode_with or ["ngram"])})
    return evaluate(target, specs, args.decode, config)


def plot(rows: dict[str, dict], decoded: dict | None, path: Path) -> None:
    """Held-out μ against the unique training tokens and against token-epochs (what more data, or more passes
    over the same data, buy)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, key, label in ((axes[0], "train_tokens", "unique training tokens"),
                           (axes[1], "token_epochs", "training tokens x epochs")):
        for name, r in rows.items():
            ax.scatter(r[key], r["mu_tf"], color="C0")
            if decoded and name in decoded["overall"]:
                ax.scatter(r[key], decoded["overall"][name]["mu"], color="C1", marker="s")
            ax.annotate(name, (r[key], r["mu_tf"]), fontsize=7, xytext=(3, 3), textcoords="offset points")
        ax.set_xscale("log")
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("held-out μ (K-chain, T=0)")
    handles = [plt.Line2D([], [], color="C0", marker="o", ls="", label="teacher-forced estimate (mu_tf)")]
    if decoded:
        handles.append(plt.Line2D([], [], color="C1", marker="s", ls="", label="decoded"))
    axes[0].legend(handles=handles, fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def table(plan: dict, rows: dict[str, dict], decoded: dict | None) -> str:
    k = max(len(r["agreement"]) for r in rows.values())
    head = ["row", "change", "steps", "tokens seen", "train s", "tok/cpu-s", *[f"agree@{i + 1}" for i in range(k)],
            "train@1", "mu_tf"]
    if decoded:
        head += ["mu", "speedup"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, r in rows.items():
        change = " ".join(plan["rows"][name] or []) or "(shared settings)"
        cells = [name, change, f"{r['steps']}/{r['total_steps']} (best {r['best_step']})", str(r["tokens"]),
                 f"{r['train_seconds']:.0f}", f"{r['tokens_per_cpu_s']:.0f}",
                 *[f"{a:.3f}" for a in r["agreement"]], *["-"] * (k - len(r["agreement"])),
                 f"{r['train_agreement'][0]:.3f}" if r["train_agreement"] else "-", f"{r['mu_tf']:.3f}"]
        if decoded:
            overall = decoded["overall"].get(name, {})
            cells += [f"{overall.get('mu', float('nan')):.2f}", f"{overall.get('speedup', float('nan')):.2f}x"]
        lines.append("| " + " | ".join(cells) + " |")
    for name, overall in (decoded["overall"] if decoded else {}).items():
        if name not in rows:  # a baseline decoded beside the rows (no training figures)
            cells = [name, "(untrained baseline)", *["-"] * (len(head) - 4),
                     f"{overall['mu']:.2f}", f"{overall['speedup']:.2f}x"]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("plan", type=Path)
    parser.add_argument("--only", default="", help="comma-separated rows to run (default: all)")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument("--plot", type=Path, default=None, help="PNG of held-out μ against tokens and token-epochs")
    args, rest = parser.parse_known_args(argv)
    overrides = [a for a in rest if "=" in a and not a.startswith("--")]
    plan = load_plan(args.plan)
    names = [n for n in plan["rows"] if not args.only or n in args.only.split(",")]
    unknown = set(args.only.split(",")) - set(plan["rows"]) if args.only else set()
    if unknown:
        sys.exit(f"ablate: unknown rows {sorted(unknown)}; the plan has {list(plan['rows'])}")
    results, drafters = {}, {}
    for name in names:
        config, resolved = row_config(plan, name, overrides)
        print(f"[ablate] {name}: {' '.join(plan['rows'][name] or []) or '(shared settings)'}", flush=True)
        drafters[name] = train_row(config, resolved)
        results[name] = summarize(Path(config.out_dir))
    decoded = decode(plan, drafters, rest) if any(a.startswith("--decode") for a in rest) else None
    text = table(plan, results, decoded)
    print("\n" + text)
    if decoded:
        print(f"exactness at T=0: {decoded['exactness']['identical']}/{decoded['exactness']['total']} outputs "
              f"identical to plain greedy decoding")
    if args.plot:
        plot(results, decoded, args.plot)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"plan": plan, "rows": results, "table": text,
                                         "decoded": decoded and {"overall": decoded["overall"],
                                                                 "domains": decoded["domains"],
                                                                 "exactness": decoded["exactness"]}}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
