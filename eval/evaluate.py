"""`evaluate`: one evaluation end to end (the target and prompts loaded, every method decoded side by side by
eval/runner.py, summarized, the cost model fitted, sweeps re-run by eval/sweeps.py) -> the OUT.json dict."""
from __future__ import annotations

import datetime as _dt
import os
import platform
import time
from dataclasses import replace
from typing import Any, Mapping, Sequence

import torch

from draftsmith.data.prompts import limit_per_domain, read_prompts
from draftsmith.eval import stats
from draftsmith.eval.config import EvalConfig
from draftsmith.eval.drafters import BASELINE, DrafterEntry, build_entries, length_policy
from draftsmith.eval.peers import Peer, build_peers
from draftsmith.eval.prompts import EvalPrompt, group_by_domain, prepare_prompts
from draftsmith.eval.runner import (Decoding, baseline_block, cost_model_block, drafted_by_block, exactness_block,
                                    mark_exactness, peers_block, run_methods, summarize_methods)
from draftsmith.eval.sweep_axes import parse_sweeps
from draftsmith.eval.sweeps import batch_crossover, run_sweeps
from draftsmith.eval.winners import winners
from draftsmith.serve.drafters.early import check_before_loading
from draftsmith.serve.drafters.settings import resolve_k
from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.core.invariant import is_invariant
from draftsmith.serve.core.target import Target, load_configured
from draftsmith.serve.methods.registry import has


def _as_target(target: Target | str, config: EvalConfig) -> Target:
    if isinstance(target, str):
        return load_configured(replace(config.target, spec=target))
    return target


def _as_rows(prompts: Any, config: EvalConfig) -> tuple[list[Any], list[str]]:
    """Prompt rows and a description of where they came from."""
    if isinstance(prompts, str):
        prompts = [prompts]
    prompts = list(prompts)
    if prompts and all(isinstance(p, str) for p in prompts):
        return read_prompts(prompts, domain_field=config.domain_field,
                            per_domain_limit=config.per_domain_limit), prompts
    return limit_per_domain(prompts, config.per_domain_limit), ["<rows passed in>"]


def settings_block(config: EvalConfig, sources: Sequence[str], prompts: Sequence[EvalPrompt], target: Target,
                   entries: Sequence[DrafterEntry], peers: Sequence[Peer]) -> dict[str, Any]:
    import transformers

    device = next(target.model.parameters()).device
    return {
        "k": config.k, "temperature": config.temperature, "top_k": config.top_k, "top_p": config.top_p,
        "max_new_tokens": config.max_new_tokens, "seed": config.seed,
        "per_domain_limit": config.per_domain_limit,
        "domain_field": config.domain_field, "prompt_sources": list(sources), "prompts_total": len(prompts),
        "domains": {d: len(idx) for d, idx in group_by_domain(prompts).items()},
        "order": [BASELINE] + [e.name for e in entries] + [p.name for p in peers],
        "draft_length": {e.name: length_policy(e.drafter) for e in entries},
        "interleaving": "per prompt, every method back to back in `order`"
                        + (f", {config.repeats} times over" if config.repeats > 1 else ""),
        "repeats": config.repeats,
        "timing": "one run per method and prompt" if config.repeats == 1 else
                  f"the fastest of {config.repeats} runs per method and prompt",
        "speedup": "drafter tokens/s over plain tokens/s on the same prompts (= plain seconds / drafter seconds "
                   "at temperature 0, where outputs are identical); spread = per-prompt min/median/max and a "
                   "bootstrap CI over prompts",
        "dtype": str(next(target.model.parameters()).dtype).replace("torch.", ""), "device": str(device),
        "invariant": is_invariant(target.model),  # batch-invariant target forwards (serve/core/invariant.py)
        "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
        "transformers": transformers.__version__, "python": platform.python_version(),
        "machine": f"{platform.machine()} {os.cpu_count()} cpus",
        "started_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "sweep": list(config.sweep),
        "notes": [f"{e.name}: the oracle's begin() (a plain greedy run giving it the answer) is excluded from its "
                  f"seconds; its speedup is the ceiling for this decoder at this K" for e in entries
                  if has(e.kind, "ceiling")],
    }


def target_block(target: Target) -> dict[str, Any]:
    return {"name": target.name, "path": target.path, "config_hash": target.config_hash,
            "tokenizer_hash": target.tokenizer_hash, "num_layers": target.num_layers,
            "chat_template": bool(getattr(target.tokenizer, "chat_template", None))}


def evaluate(target: Target | str, drafters: Mapping[str, Any], prompts: Any, config: EvalConfig | None = None) -> dict:
    """Evaluate `drafters` on `target` over `prompts`; returns the OUT.json dict.

    target:   a draftsmith.serve.core.target.Target or a spec for load_target (e.g. "demo").
    drafters: name -> spec string for draftsmith.serve.drafters.build_drafter ("ngram", "model:PATH", "oracle", a
              drafter folder) or an already built Drafter.
    prompts:  sources for data.prompts.load_prompts (a string or a list; `DOMAIN=source` tags a source),
              or rows with `id`, `domain`, `messages`.
    """
    config = config or EvalConfig()
    config.validate()  # a bad sweep or value fails before anything runs, in a config built by hand too
    if config.target.threads is not None:
        threads = torch.get_num_threads()
        config.target.apply_threads()
        try:
            return evaluate(target, drafters, prompts, replace(config, target=replace(config.target, threads=None)))
        finally:
            torch.set_num_threads(threads)
    started = time.perf_counter()
    # a missing or unreadable prompts file or a drafter spec naming no folder fails before the target loads
    rows, sources = _as_rows(prompts, config)
    check_before_loading([value for value in drafters.values() if isinstance(value, str)], target)
    target = _as_target(target, config)
    eval_prompts = prepare_prompts(target.tokenizer, rows)
    if not eval_prompts:
        raise DraftsmithError("no prompts to evaluate")
    longest = max([config.max_new_tokens] + [v for axis, values in parse_sweeps(config.sweep)
                                             if axis == "max_new_tokens" for v in values])
    entries = build_entries(target, drafters, max_new_tokens=longest)
    config = replace(config, k=resolve_k([e.drafter for e in entries], config.k))  # what settings.k reports
    peers = build_peers(entries, hf_plain=config.hf_plain, dtype=next(target.model.parameters()).dtype,
                        device=config.target.resolved_device()) if config.peers else []
    decoding = Decoding.from_config(config)
    records = run_methods(target, entries, peers, eval_prompts, decoding, warmup=config.warmup,
                          progress=config.progress, repeats=config.repeats)
    names = [e.name for e in entries]
    mark_exactness(records, names + [p.name for p in peers])
    domains, overall = summarize_methods(records, names, eval_prompts, k=decoding.k, config=config)
    result: dict[str, Any] = {
        "target": target_block(target),
        "settings": settings_block(config, sources, eval_prompts, target, entries, peers),
        "drafters": [e.describe() for e in entries],
        "domains": domains,
        "overall": overall,
        "baseline": baseline_block(records, eval_prompts),
        "peers": peers_block(records, peers, eval_prompts, k=decoding.k, config=config),
        "cost_model": (cost_model_block(target, records, names, eval_prompts, k=decoding.k, config=config)
                       if config.cost_model else None),
        "exactness": exactness_block(records, names, decoding.temperature, target=target, top_k=decoding.top_k,
                                     top_p=decoding.top_p),
        "drafted_by": drafted_by_block(records, names),
        "records": [rec for name in records for rec in records[name]],
    }
    result["settings"]["timing_spread"] = stats.timing_spread(result["records"])
    result["winners"] = winners(result)
    if config.sweep:
        result["sweeps"] = run_sweeps(target, entries, eval_prompts, config, base=result)
        result["batch_crossover"] = batch_crossover(target, result)
    result["settings"]["wall_seconds"] = time.perf_counter() - started
    return result
