"""Validate an exported folder: the engine's schema (config fields, tensors, layer ids, no untrained embeddings),
the engine's own package where one runs beside draftsmith, then the folder read back as the engine would and
drafted next to the native drafter: every proposal identical, μ equal. Any failure raises ExportError."""
from __future__ import annotations

from pathlib import Path

from draftsmith.serve.drafters.folder import load_head, make_drafter, read_config as read_native_config
from draftsmith.serve.export.common import (ExportError, check_config, check_layer_ids, check_no_untrained_embeddings,
                                 check_tensors, compare_drafts, default_prompts, read_config, read_tensors,
                                 target_facts)
from draftsmith.serve.export.formats import export_format
from draftsmith.serve.export.readback import read_head
from draftsmith.serve.export.report import ExportReport
from draftsmith.serve.methods.registry import method
from draftsmith.serve.core.target import Target


def validate_export(out_dir: str | Path, fmt: str, *, native_dir: str | Path, target: Target, prompts=None,
                    k: int | None = None, max_new_tokens: int = 32, verifier: str | None = None,
                    report: ExportReport | None = None, shown_as: str | Path | None = None) -> ExportReport:
    """Check an exported folder against the engine's schema, then read it back and draft next to the native.
    `shown_as`: the path errors name (the folder's final place while a temporary copy is validated)."""
    module = export_format(fmt)
    out = Path(out_dir)
    where = f"{fmt} export {shown_as or out}"
    config = read_native_config(native_dir)
    report = report or ExportReport(format=fmt, method=config.method, out_dir=str(out), target=target.name)
    exported, tensors = read_config(out), read_tensors(out)
    spec = module.expected(config, target_facts(target, verifier=verifier))
    if spec.method != config.method:
        raise ExportError(f"{where}: written for {spec.method}, the native drafter is {config.method}")
    check_config(exported, spec, where=where)
    for problem in module.check_extra(exported):
        raise ExportError(f"{where}: {problem}")
    report.checks.append(f"config: {len(spec.config)} fields as {fmt} reads them")
    check_tensors(tensors, spec, where=where)
    report.checks.append(f"tensors: exactly {len(spec.tensors)} names, shapes from the target's config")
    check_no_untrained_embeddings(tensors, target, where=where)
    report.checks.append("no embeddings exported (the engine shares the target's)")
    if spec.engine_layer_ids:  # a head of aux layers (EAGLE-3): their ids in the engine's convention
        check_layer_ids(exported, spec, native_ids=list(config.aux_layer_ids), engine=fmt, where=where)
        report.layer_ids = {"draftsmith": list(config.aux_layer_ids), fmt: list(spec.engine_layer_ids)}
        report.checks.append(f"aux layer ids {config.aux_layer_ids} (draftsmith) -> {spec.engine_layer_ids} ({fmt})")

    attn = config.layer_config.get("_attn_implementation", "sdpa") if config.layer_config else "sdpa"
    head = read_head(out, target, fmt=fmt, attn_implementation=attn)
    report.package_check = module.package_check(out, target, head, where=where)
    if report.package_check:
        report.checks.append(report.package_check)
    weight = target.model.get_input_embeddings().weight
    native = make_drafter(load_head(native_dir, device=weight.device, dtype=weight.dtype), target)
    readback = make_drafter(head.to(device=weight.device, dtype=weight.dtype), target)
    k = k or method(config.method).validation_k(config)
    comparison = compare_drafts(target, native, readback, prompts if prompts is not None else default_prompts(target),
                                k=k, max_new_tokens=max_new_tokens, where=where)
    report.k = k
    report.prompts, report.cycles = comparison.prompts, comparison.cycles
    report.proposals_compared = comparison.proposals_compared
    report.mu_native, report.mu_readback = comparison.mu_native, comparison.mu_readback
    report.checks.append(f"read back through the {fmt} reader: {comparison.proposals_compared} proposed tokens in "
                         f"{comparison.cycles} cycles identical to the native drafter's; "
                         f"mu {comparison.mu_readback:.3f} = {comparison.mu_native:.3f}")
    return report
