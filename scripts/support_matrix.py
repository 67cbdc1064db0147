"""The support matrix: target family x {train, exact decode, vLLM, SGLang, speculators, engine-checked}, from what
really ran. `check_family` is the check tests/test_families.py asserts on; this script runs it for every family
(tiny random targets, ~10 s each on one CPU thread), reads the engines' own verdicts from a `scripts/check_engines.py
--json` file when given, prints the Markdown table and, with --readme, writes it into README.md between the
`<!-- support-matrix -->` markers.

    .venv/bin/python scripts/support_matrix.py [--families llama,qwen3] [--engines-json FILE] [--readme README.md]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from draftsmith.serve.core.families import tiny_families

ROOT = Path(__file__).resolve().parents[1]
FAMILIES = tiny_families()  # serve/core/families.py's rows with a tiny test target, in its order


def matrix_methods() -> tuple[str, ...]:
    """The methods whose engine forms depend on the target's family (a head with a decoder layer: EAGLE-3, EAGLE-1,
    newest first); Medusa reads the final state alone and is checked once, not per family; a variant of one of them
    (P-EAGLE: EAGLE-3's layer and folder) is covered by its row."""
    from draftsmith.serve.methods.registry import method, names

    return tuple(sorted((n for n in names(trained=True) if method(n).llama_layer and not method(n).variant_of),
                        key=lambda n: method(n).title, reverse=True))


def formats_of(name: str) -> tuple[str, ...]:
    from draftsmith.serve.methods.registry import method

    return tuple(method(name).exports)
MARK, END = "<!-- support-matrix -->", "<!-- /support-matrix -->"


@dataclass
class FamilyResult:
    family: str                      # the tests' name (tests/tiny_models.py)
    model_type: str                  # the target's text model_type
    train_seconds: dict[str, float] = field(default_factory=dict)     # method -> seconds
    exact: dict[str, tuple[int, int]] = field(default_factory=dict)   # method -> (identical, prompts)
    exports: dict[str, dict[str, str]] = field(default_factory=dict)  # method -> format -> verdict
    mu: dict[str, dict[str, tuple[float, float]]] = field(default_factory=dict)  # method -> format -> (native, back)


def check_family(family: str, work: Path, *, prompts: int = 3, new_tokens: int = 16) -> FamilyResult:
    """Train EAGLE-3 and EAGLE-1 on a tiny target of `family`, decode held-out random prompts against plain greedy
    decoding, export in every format (an engine that cannot host the family refuses in one line)."""
    import torch

    from draftsmith.serve.core.config import load_config
    from draftsmith.serve.decoding import plain_generate, speculative_generate
    from draftsmith.serve.drafters import build_drafter
    from draftsmith.serve.core.errors import DraftsmithError
    from draftsmith.serve.export import export_drafter
    from draftsmith.serve.export.common import default_prompts
    from draftsmith.serve.core.target import load_target, text_config
    from tests.train_fixtures import greedy_rows, save_rows, sharp_target
    from draftsmith.train.config import TrainConfig
    from draftsmith.train.run import train_drafter

    target_dir = sharp_target(work / "target", family=family, num_hidden_layers=4)
    dataset = save_rows(greedy_rows(target_dir, rows=12, new_tokens=20), work / "data")
    target = load_target(target_dir)
    result = FamilyResult(family, text_config(target.config).model_type)
    held_out = torch.randint(0, 256, (prompts, 8), generator=torch.Generator().manual_seed(7))
    plain = [plain_generate(target, p[None], max_new_tokens=new_tokens).output_ids for p in held_out]
    from draftsmith.serve.methods.registry import method as method_of

    for method in matrix_methods():
        t0 = time.perf_counter()
        folder = train_drafter(load_config(TrainConfig, overrides=[
            f"target={target_dir}", f"data.dataset={dataset}", f"out_dir={work / method}", f"model.method={method}",
            "model.num_speculative_tokens=3", "model.ttt_steps=2", "optim.batch_size=8", "optim.max_steps=12",
            "optim.lr=1e-2", "data.eval_rows=4", "tracking=none", "log.progress=false", "log.every=20",
            "checkpoint.every=0", *(("model.draft_vocab_size=200",) if method_of(method).own_vocab else ())]))
        result.train_seconds[method] = time.perf_counter() - t0
        drafter = build_drafter(str(folder), target)
        same = sum(speculative_generate(target, drafter, p[None], max_new_tokens=new_tokens, k=3).output_ids == ref
                   for p, ref in zip(held_out, plain))
        result.exact[method] = (same, prompts)
        result.exports[method], result.mu[method] = {}, {}
        for fmt in formats_of(method):
            try:
                report = export_drafter(folder, fmt, work / f"{method}-{fmt}", target=target,
                                        prompts=default_prompts(target, count=1), k=3, max_new_tokens=10)
            except DraftsmithError as err:
                result.exports[method][fmt] = f"refused: {err}"
                continue
            result.mu[method][fmt] = (report.mu_native, report.mu_readback)
            equal = report.mu_native == report.mu_readback and report.proposals_compared > 0
            result.exports[method][fmt] = "ok" if equal else f"mu {report.mu_readback} != {report.mu_native}"
    return result


def _engine_cells(rows: list[dict]) -> dict[str, str]:
    """check_engines rows (family-bound methods only: Medusa is family-independent) -> family -> one cell, per engine
    release: how many exports its own loader drafted identically, how many it loaded without a step, refusals,
    failures."""
    tally: dict[str, dict[str, dict[str, int]]] = {}
    family_bound = set(matrix_methods())
    for row in rows:
        if row["method"] not in family_bound:
            continue
        result = row["result"]
        kind = ("identical" if result.startswith("loads, drafts identically") else
                "refused" if result.startswith("refused by the exporter") else
                "loaded, step not run" if result.startswith("loads: ") else
                # the engine cannot even inspect the target's class on a machine without its GPU kernels
                "target class not importable on CPU" if "failed to be inspected" in result else "FAILS")
        counts = tally.setdefault(row.get("family", "llama"), {}).setdefault(row["engine"], {})
        counts[kind] = counts.get(kind, 0) + 1
    return {family: "; ".join(f"{engine}: " + ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items()))
                              for engine, counts in engines.items())
            for family, engines in tally.items()}


def _cell(verdict: str | None) -> str:
    if verdict is None:
        return "–"
    if verdict == "ok":
        return "✓"
    return "✗ (engine lacks it)" if "cannot host" in verdict else "✗ " + verdict[:60]


def matrix_markdown(results: list[FamilyResult], engine_rows: list[dict] | None = None) -> str:
    engines = _engine_cells(engine_rows or [])
    from draftsmith.serve.methods.registry import method

    shown = matrix_methods()
    titles = " / ".join(method(m).title for m in shown)
    # a format every shown method has gets a cell per method; one only some have (speculators: EAGLE-3) one cell
    shared = [f for f in ("vllm", "sglang") if all(f in formats_of(m) for m in shown)]
    single = [(f, m) for m in shown for f in formats_of(m) if f not in shared]
    engine_names = {"vllm": "vLLM", "sglang": "SGLang", "speculators": "speculators"}
    lines = [f"| family (model_type) | train {titles} | exact decode | "
             + "".join(f"{engine_names[f]} {titles} | " for f in shared)
             + "".join(f"{engine_names[f]} | " for f, _ in single) + "engine-checked |",
             "|---|---|---|" + "---|" * (len(shared) + len(single)) + "---|"]
    for r in results:
        exact = sum(a for a, _ in r.exact.values()), sum(b for _, b in r.exact.values())
        train = " / ".join(f"✓ {r.train_seconds[m]:.0f} s" for m in shown)
        cells = [" / ".join(_cell(r.exports[m].get(f)) for m in shown) for f in shared]
        cells += [_cell(r.exports[m].get(f)) for f, m in single]
        lines.append(f"| {r.family} ({r.model_type}) | {train} | {exact[0]}/{exact[1]} identical | "
                     + "".join(f"{c} | " for c in cells) + f"{engines.get(r.family, '–')} |")
    return "\n".join(lines)


def write_into(readme: Path, table: str, note: str) -> None:
    text = readme.read_text()
    if MARK not in text:
        raise SystemExit(f"{readme} has no {MARK} line to write the matrix under")
    head, _, rest = text.partition(MARK)
    tail = rest.partition(END)[2] if END in rest else rest
    readme.write_text(f"{head}{MARK}\n{table}\n\n{note}\n{END}{tail}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sys.path.insert(0, str(ROOT))
    from tests.tiny_models import HYBRID_FAMILIES  # hybrid targets and Gemma 4 (tests/test_hybrid_targets.py)

    parser.add_argument("--families", default=",".join([*FAMILIES, *HYBRID_FAMILIES]))
    parser.add_argument("--engines-json", default="", help="the --json output of scripts/check_engines.py")
    parser.add_argument("--readme", default="", help="write the table into this README between the markers")
    parser.add_argument("--json", default="", help="also write the per-family results here")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    results = []
    for family in args.families.split(","):
        with tempfile.TemporaryDirectory(prefix=f"draftsmith-{family}-") as work:
            results.append(check_family(family, Path(work)))
        print(f"{family}: {results[-1].exports}", file=sys.stderr)
    engine_rows = json.loads(Path(args.engines_json).read_text()) if args.engines_json else None
    table = matrix_markdown(results, engine_rows)
    print(table)
    refusals = sorted({v.split(": ", 1)[1] for r in results for m in r.exports.values() for v in m.values()
                       if v.startswith("refused")})
    note = ("Tiny random targets of each family (4 layers), EAGLE heads trained, decoded against plain greedy decoding "
            "and exported by `scripts/support_matrix.py`; every export is read back by draftsmith with μ equal to the "
            "native drafter's."
            + (" Engine-checked: `scripts/check_engines.py` loads each export with the engine's own config readers, "
               "draft classes and `load_weights`, runs the family's own target class for the aux states and compares "
               "one draft step (identical = logits, token ids and fed-back state within 1e-4); SGLang runs as its "
               "CPU engine, and an export whose step needs a kernel with no CPU path is loaded, every tensor read, "
               "without a step (loaded, step not run); where vLLM cannot import the target's own class without its "
               "GPU kernels (target class not importable on CPU), its loader was not reached." if engine_rows else "")
            + " The draft layer is a Llama layer for every family (serve/drafters/draft_layer.py). Refused exports, "
              "each before anything is written:\n" + "\n".join(f"- {r}" for r in refusals))
    if args.json:
        Path(args.json).write_text(json.dumps([r.__dict__ for r in results], indent=2, default=list) + "\n")
    if args.readme:
        write_into(Path(args.readme), table, note)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
