"""The main job end to end on the embedded default target: `draftsmith demo [--quick]`.

fetch target -> self-distilled dataset from the built-in prompt sets, with its hidden-state cache recorded by the same
forwards (offline mode: `data build --capture`) -> train EAGLE-3 (and Medusa) -> evaluate mu per domain and speed
against plain decoding, the n-gram drafter and the hybrid of both -> export for vLLM and SGLang (validated by reading
back) -> a short live generation. Every stage reuses finished work when rerun.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, ClassVar, TYPE_CHECKING

from draftsmith.data.config import CaptureConfig, DataBuildConfig
from draftsmith.eval.config import EvalConfig
from draftsmith.serve.core.config import save_config, to_dict
from draftsmith.serve.core.identity import sha256_file
from draftsmith.serve.core.target_config import TargetConfig
from draftsmith.train.config import TrainConfig

if TYPE_CHECKING:  # annotations only: the target's module imports torch
    from draftsmith.serve.core.target import Target


def _train_defaults(method: str) -> TrainConfig:
    config = TrainConfig()
    config.model.method = method
    config.tracking = "none"
    return config


@dataclass
class DemoConfig:
    ALIASES: ClassVar[dict[str, str]] = {"target": "target.spec"}  # `target: demo` (serve.core.config.load_config)
    RANGES: ClassVar[dict[str, str]] = {"eval_prompts_per_domain": ">= 1", "export_check_prompts": ">= 1",
                                        "export_check_tokens": ">= 2", "generate_max_new_tokens": ">= 1"}
    target: TargetConfig = field(default_factory=lambda: TargetConfig(dtype="auto"))  # auto: the probe's choice
    out_dir: str = "runs/demo"
    budget: str = "off"  # wall-clock budget (`--budget 30m`): every stage sized to it from the measured machine
    domains: list[str] = field(default_factory=list)  # built-in domains; empty = all
    eval_prompts_per_domain: int = 3  # the last N built-in prompts of each domain are held out for eval
    methods: list[str] = field(default_factory=lambda: ["eagle3", "medusa"])
    export_formats: list[str] = field(default_factory=lambda: ["vllm", "sglang"])
    export_check_prompts: int = 3  # prompts the read-back check runs each export on
    export_check_tokens: int = 32  # tokens generated per read-back prompt
    generate_prompt: str = "Write a Python function that checks whether a string is a palindrome."
    generate_max_new_tokens: int = 64
    # offline: the target's hidden states are kept while it answers (the cache), then every method and epoch trains
    # from the cache (no target forward in the step); online: the target runs inside every training step.
    train_mode: str = "offline"
    data: DataBuildConfig = field(default_factory=DataBuildConfig)
    capture: CaptureConfig = field(default_factory=CaptureConfig)
    eagle3: TrainConfig = field(default_factory=lambda: _train_defaults("eagle3"))
    medusa: TrainConfig = field(default_factory=lambda: _train_defaults("medusa"))
    eval: EvalConfig = field(default_factory=EvalConfig)


FINISHED = "finished_stages.json"  # stage -> the inputs it finished from (eval and exports: see `finished`)


@dataclass
class Stage:
    name: str
    seconds: float
    note: str = ""
    planned: float | None = None  # seconds the budget's plan gave it (`--budget`)


def split_builtin(domains: list[str], held_out: int, out: Path) -> tuple[Path, Path]:
    """Write train / eval JSONL files from the built-in sets: the last `held_out` prompts of each domain are eval."""
    from draftsmith.data.builtin import BUILTIN_DOMAINS, builtin_files

    train_rows, eval_rows = [], []
    for domain in domains or BUILTIN_DOMAINS:
        rows = [json.loads(line) for line in builtin_files(domain)[0].read_text().splitlines() if line.strip()]
        for row in rows:
            row.setdefault("domain", domain)
        cut = max(1, len(rows) - held_out)
        train_rows += rows[:cut]
        eval_rows += rows[cut:]
    out.mkdir(parents=True, exist_ok=True)
    train_path, eval_path = out / "prompts_train.jsonl", out / "prompts_eval.jsonl"
    for path, rows in ((train_path, train_rows), (eval_path, eval_rows)):
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
    return train_path, eval_path


def _made_by(config: TrainConfig, data_digest: str) -> dict:
    """What a trained head is reused for: its config and data; not its time budget (how long, not what)."""
    made = to_dict(config)
    made["optim"] = {k: v for k, v in made["optim"].items() if k != "max_seconds"}
    return {"config": made, "data_digest": data_digest}


def _same_config(folder: Path, config: TrainConfig, data_digest: str) -> bool:
    saved = folder / "train_config.json"
    return (folder / "drafter" / "config.json").is_file() and saved.is_file() and \
        json.loads(saved.read_text()) == _made_by(config, data_digest)


def train_if_needed(config: TrainConfig, data_digest: str, log: Callable[[str], None]) -> tuple[Path, bool]:
    """Train unless a finished drafter made by exactly this config from exactly this data is already there."""
    from draftsmith.train.run import train_drafter

    out = Path(config.out_dir)
    if _same_config(out, config, data_digest):
        log(f"[demo] {config.model.method}: reusing {out / 'drafter'}")
        return out / "drafter", True
    drafter = train_drafter(config, overwrite=True)  # this demo's own drafter of other settings or data
    (out / "train_config.json").write_text(json.dumps(_made_by(config, data_digest), indent=1))
    return drafter, False


def exactness_summary(block: dict) -> dict:
    """The demo summary's exactness: identical / total and the audit's counts, per drafter too."""
    audit = block.get("audit") or {}
    kinds = audit.get("by_drafter") or {}
    return {"identical": block.get("identical"), "total": block.get("total"),
            "rounding_flips": audit.get("rounding_flips", 0), "unexplained": audit.get("unexplained", 0),
            "by_drafter": {name: {**b, **kinds.get(name, {})} for name, b in (block.get("by_drafter") or {}).items()}}


def build_data(target: Target, config: DemoConfig, out: Path, deadline: float | None, log: Callable[[str], None]):
    """The self-distilled dataset and, offline, its hidden-state cache from the same forwards (data build
    --capture). A cache the demo made from other data or settings is made again: the rerun reuses every answered
    row and the states recorded beside them, so it generates nothing."""
    import shutil

    from draftsmith.data.build import build_dataset
    from draftsmith.data.cache import CacheError

    offline = config.train_mode == "offline"

    def build():
        return build_dataset(target, config.data, out_dir=out / "data", log=log, deadline=deadline,
                             capture=config.capture if offline else None, cache_dir=out / "cache" if offline else None)

    try:
        return build()
    except CacheError as err:
        if "refusing to mix shards" not in str(err) and "holds a capture" not in str(err):
            raise
        log(f"[demo] {out / 'cache'} was captured from other data or settings; capturing again")
        shutil.rmtree(out / "cache")
        return build()


def _spec_digest(spec: str) -> str:
    """A drafter spec with the digest of its folder's weights: a retrained drafter is a different input."""
    from draftsmith.serve.drafters.folder import WEIGHTS_NAME
    from draftsmith.serve.drafters.spec import spec_path

    path = spec_path(spec)
    weights = Path(path) / WEIGHTS_NAME if path else None
    return f"{spec}@{sha256_file(weights)}" if weights and weights.is_file() else spec


def finished(out: Path, stage: str, inputs: dict) -> bool:
    """Whether `stage` already finished in `out` from exactly these inputs (see record_finished)."""
    path = out / FINISHED
    return path.is_file() and json.loads(path.read_text()).get(stage) == inputs


def record_finished(out: Path, stage: str, inputs: dict) -> None:
    """Record that `stage` finished from `inputs`, so a rerun reuses its output instead of measuring again."""
    path = out / FINISHED
    done = json.loads(path.read_text()) if path.is_file() else {}
    done[stage] = inputs
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(done, indent=1))
    tmp.replace(path)


def mu_table(result: dict) -> str:
    """Markdown-ish console table: mu (and speedup) per domain per drafter, and which drafter was fastest (a tie
    names both when the runner-up is within the run's timing resolution, measured with eval.repeats > 1)."""
    drafters = [d["name"] for d in result["drafters"]]
    domains = sorted(result["domains"])
    best = result.get("winners") or {}
    width = max(12, *(len(d) for d in drafters))
    lines = [f"{'domain':<14}" + "".join(f"{d:>{width}}" for d in drafters) + "  fastest"]
    for domain in domains + ["overall"]:
        cells = result["overall"] if domain == "overall" else result["domains"][domain]
        row = f"{domain:<14}"
        for d in drafters:
            entry = cells.get(d)
            row += f"{'-':>{width}}" if not entry else \
                f"{entry['mu']:>{width - 7}.2f} ({entry['speedup']:.2f}x)"
        won = best.get(domain)
        if won:
            row += f"  {won['drafter']}" + (f" = {won['runner_up']} (tie)" if won.get("tie") else "")
        lines.append(row)
    return "\n".join(lines)


def training_precision(precision: str, dtype: str) -> str:
    """The heads' training precision: the recipe's, where `auto` becomes bf16 when the probe chose a bfloat16
    target (`auto` alone means fp32 on a CPU). The probe chooses bf16 where its matmuls are the faster; heads train
    to the same acceptance in both (docs/results.md, "Choosing the recipe"), and on an AVX512-BF16 EPYC a bf16
    EAGLE-3 step of the demo took 0.67x the fp32 one."""
    return "bf16" if precision == "auto" and dtype == "bfloat16" else precision


def measure_machine(config: DemoConfig, log: Callable[[str], None]):
    """The probe of scripts/demo/machine.py: sets the target's dtype (when auto) and torch's threads (unless set)."""
    import torch

    from draftsmith.demo.machine import MachineReport, probe_hardware

    began = time.perf_counter()
    hardware = probe_hardware(requested_threads=config.target.threads,
                              requested_dtype=None if config.target.dtype == "auto" else config.target.dtype)
    config.target.dtype = hardware.dtype
    torch.set_num_threads(hardware.threads)
    report = MachineReport(hardware, seconds=time.perf_counter() - began)
    for line in report.lines():
        log(f"[demo] {line}")
    return report


def _trained_note(folder: str | Path) -> str:
    """How the head's training ended: its steps and epochs, and what ended it (its time, held-out acceptance that
    stopped rising, or its epochs)."""
    from draftsmith.train.tracking import read_log

    summary = Path(folder) / "training_summary.json"
    if not summary.is_file():
        return ""
    done = json.loads(summary.read_text())
    log = read_log(Path(folder).parent)
    fits = [r for r in log if r.get("event") == "time_budget"]
    why = ("held-out acceptance stopped rising" if any(r.get("event") == "early_stop" for r in log)
           else "its time" if fits and fits[-1]["total_steps"] < fits[-1]["most_steps"] else "its epochs")
    return f"({done.get('steps')} steps, {done.get('epochs', 0):.2f} epochs; ended by {why})"


def run_demo(config: DemoConfig, *, log: Callable[[str], None] = print) -> dict:
    import datasets
    import torch

    from draftsmith.data.capture import dataset_digest
    from draftsmith.eval.report import timing_line, write_report
    from draftsmith.eval.evaluate import evaluate
    from draftsmith.serve.core.config import ConfigError
    from draftsmith.serve.decoding import speculative_generate
    from draftsmith.serve.drafters import build_drafter
    from draftsmith.serve.core.errors import DraftsmithError
    from draftsmith.serve.export import check_export, export_drafter
    from draftsmith.serve.export.common import default_prompts
    from draftsmith.serve.core.prompts import encode_prompt
    from draftsmith.serve.core.target import load_configured
    from draftsmith.serve.core.invariant import is_invariant
    from draftsmith.demo.machine import probe_target
    from draftsmith.eval.stats import exactness_verdict
    from draftsmith.demo.budget import parse_budget
    from draftsmith.demo.pacer import Pacer, rates_of, workload_of

    if config.train_mode not in ("offline", "online"):
        raise ConfigError(f"train_mode must be offline or online, got {config.train_mode!r}")
    out = Path(config.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    wall, began = time.perf_counter(), time.monotonic()
    budget = parse_budget(config.budget)
    stages: list[Stage] = []
    pacer = Pacer.off(log)

    def stage(name: str, t0: float, note: str = "", **facts) -> None:
        seconds = time.perf_counter() - t0
        stages.append(Stage(name, seconds, note, planned=pacer.planned_seconds(name)))
        planned = f" (planned {stages[-1].planned:.0f}s)" if stages[-1].planned is not None else ""
        log(f"[demo] {name} done in {seconds:.1f}s{planned} {note}")
        pacer.after(name, seconds, **facts)

    t0 = time.perf_counter()
    machine = measure_machine(config, log)  # picks the compute dtype and threads (unless the config sets them)
    save_config(config, out, "demo_config.resolved.yaml")
    target = load_configured(config.target)
    train_prompts, eval_prompts = split_builtin(config.domains, config.eval_prompts_per_domain, out)
    if budget is not None:
        work = workload_of(config, target, train_prompts)
        # the batched step over the window a row reaches on average: its prompt and one answer
        machine.target = probe_target(target, batch=config.data.batch_size, prefill_tokens=1024,
                                      window=round(work.prompt_tokens + work.turn_tokens))
        log(f"[demo] {machine.lines()[-1]}")
        machine.seconds = time.perf_counter() - t0
        pacer = Pacer.start(out, budget, rates_of(machine.target), work, began=began, log=log)
        config.data.per_domain_limit = pacer.decisions["per_domain_limit"]
        config.eval.max_new_tokens, config.eval.repeats = pacer.decisions["eval"]
        save_config(config, out, "demo_config.resolved.yaml")
    stage("target", t0, f"({target.name}, {target.num_layers} layers, {config.target.dtype}, "
                        f"{torch.get_num_threads()} threads)")

    t0 = time.perf_counter()
    config.data.prompts = [str(train_prompts)]
    deadline = pacer.deadline_seconds()
    built = build_data(target, config, out, None if deadline is None else time.monotonic() + deadline, log)
    cache = built.capture
    stage("data", t0, f"({built.rows} rows, {built.tokens} tokens, {built.reused_batches} batches reused"
                      + (f"; cache {cache.bytes / 2**20:.0f} MiB, {cache.tokens_recorded} of {cache.tokens_captured} "
                         f"tokens' states recorded while generating)" if cache else ")"),
          reused=built.generated_batches == 0 and (cache is None or cache.shards_written == 0))
    digest = dataset_digest(datasets.load_from_disk(str(out / "data")))  # drafters are reused for this data only

    offline = config.train_mode == "offline"

    drafters: dict[str, str] = {}
    for method in pacer.training_order(config.methods):
        t0 = time.perf_counter()
        train_config: TrainConfig = getattr(config, method)
        train_config.target.spec = config.target.spec
        train_config.out_dir = str(out / method)
        train_config.data.mode = config.train_mode
        train_config.data.dataset, train_config.data.cache = str(out / "data"), str(out / "cache") if offline else ""
        train_config.distributed.precision = training_precision(train_config.distributed.precision, config.target.dtype)
        if pacer.active:  # a head an earlier run finished is not planned: it is reused whatever its seconds
            train_config.optim.max_seconds = pacer.before(f"train {method}").get("max_seconds", 0.0)
        folder, reused = train_if_needed(train_config, digest, log)
        drafters[method] = str(folder)
        stage(f"train {method}", t0, "(reused)" if reused else _trained_note(folder), reused=reused)
    drafters = {method: drafters[method] for method in config.methods}  # the recipe's order: the first is the hybrid's

    t0 = time.perf_counter()
    specs = {**drafters, "ngram": "ngram"}
    if drafters:  # the n-gram drafter where the answer copies the prompt, the first trained head elsewhere
        specs["hybrid"] = f"hybrid:{next(iter(drafters.values()))}"
    eval_inputs = {"target": config.target.spec, "eval": to_dict(config.eval), "prompts": sha256_file(eval_prompts),
                   "drafters": {name: _spec_digest(spec) for name, spec in specs.items()}}
    if finished(out, "eval", eval_inputs) and (out / "report" / "result.json").is_file():
        result = json.loads((out / "report" / "result.json").read_text())
        paths = {"markdown": out / "report" / "report.md", "json": out / "report" / "result.json"}
        stage("eval", t0, f"(reused {paths['markdown']})", reused=True)
    else:
        result = evaluate(target, specs, [str(eval_prompts)], config.eval)
        paths = write_report(result, out / "report")
        record_finished(out, "eval", eval_inputs)
        stage("eval", t0, f"({paths['markdown']})")

    exports, exports_began = {}, time.perf_counter()
    for method, folder in drafters.items():
        for fmt in config.export_formats:
            try:
                check_export(folder, fmt)
            except DraftsmithError as refused:  # e.g. SGLang has no Medusa; vLLM's needs full-vocabulary heads
                log(f"[demo] export {method}/{fmt} skipped: {refused}")
                continue
            t0 = time.perf_counter()
            name, export_dir = f"{method}-{fmt}", out / "exports" / f"{method}-{fmt}"
            export_inputs = {"drafter": _spec_digest(folder), "prompts": config.export_check_prompts,
                             "tokens": config.export_check_tokens}
            if finished(out, f"export {name}", export_inputs) and (export_dir / "export_report.json").is_file():
                report = json.loads((export_dir / "export_report.json").read_text())
                note = "reused, "
            else:
                report = vars(export_drafter(folder, fmt, export_dir, target=target, target_spec=config.target.spec,
                                             prompts=default_prompts(target, count=config.export_check_prompts),
                                             max_new_tokens=config.export_check_tokens,
                                             overwrite=True))  # this demo's own export of an earlier drafter
                record_finished(out, f"export {name}", export_inputs)
                note = ""
            exports[name] = report["out_dir"]
            stage(f"export {method}/{fmt}", t0, f"({note}mu native {report['mu_native']:.2f} = read back "
                                                f"{report['mu_readback']:.2f})")

    pacer.after("exports", time.perf_counter() - exports_began)

    t0 = time.perf_counter()
    best = max(specs, key=lambda name: result["overall"][name]["speedup"])  # the fastest on the held-out prompts
    drafter = build_drafter(specs[best], target)
    ids = encode_prompt(target.tokenizer, config.generate_prompt)  # the chat template where the target has one
    gen = speculative_generate(target, drafter, torch.tensor([ids]),
                               max_new_tokens=config.generate_max_new_tokens, k=config.eval.k)
    text = target.tokenizer.decode(gen.output_ids, skip_special_tokens=True)
    stage("generate", t0, f"({best}: mu {gen.stats.mu:.2f}, {gen.stats.new_tokens / gen.stats.seconds:.1f} tok/s)")

    summary = {"wall_seconds": round(time.perf_counter() - wall, 1), "machine": machine.to_dict(),
               "dtype": config.target.dtype, "invariant": is_invariant(target.model),
               "exactness": exactness_summary(result["exactness"]),
               "threads": torch.get_num_threads(), "budget": pacer.finish(),
               "stages": [vars(s) for s in stages], "report": str(paths["markdown"]), "json": str(paths["json"]),
               "exports": exports, "drafters": drafters, "generation": {"drafter": best, "text": text,
                                                                        **gen.stats.to_dict()}}
    (out / "demo_summary.json").write_text(json.dumps(summary, indent=1))
    log("\n" + "=" * 72)
    log(f"mu per domain (tokens per target forward; speedup over plain decoding), K={config.eval.k}, "
        f"T={config.eval.temperature}:")
    log(mu_table(result))
    timing = timing_line(result.get("settings") or {})
    if timing:
        log(f"{timing} (a tie: within that)")
    log(f"exactness at T=0: {result['exactness']['identical']}/{result['exactness']['total']} outputs identical "
        f"to plain greedy decoding in {config.target.dtype} ({exactness_verdict(result['exactness'])})")
    log(f"\nlive generation ({best}): {text.strip()[:300]}")
    log("\nstage times: " + ", ".join(f"{s.name} {s.seconds:.0f}s" + (f" (planned {s.planned:.0f}s)"
                                                                    if s.planned is not None else "")
                                      for s in stages))
    log(f"wall time: {summary['wall_seconds'] / 60:.1f} min" + (
        f" ({summary['budget']['spent'] / 60:.1f} min of a {budget / 60:.0f} min budget over "
        f"{summary['budget']['runs']} run{'s' * (summary['budget']['runs'] > 1)})" if budget else ""))
    log(f"report: {paths['markdown']}\nexports: " + ", ".join(exports.values()))
    return summary
