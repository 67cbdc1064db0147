"""Export a native drafter folder for a serving engine, then prove the engine would read it as trained.

    report = export_drafter("runs/x/drafter", "vllm", "exports/x-vllm", target=target)

checks that the engine (and the named `engine_version`, if any) can load this drafter and refuses it before
writing anything otherwise (serve/export/write.py); writes OUT/config.json + OUT/model.safetensors in the
engine's format (serve/export/{vllm,sglang,speculators}.py); validates them against what the engine reads,
reads the folder back through that format's engine-faithful reader and drafts next to the native drafter
(serve/export/validate.py); writes OUT/README.md (serving command, engine versions, validation figures) and
OUT/export_report.json (serve/export/report.py). Any failed check raises ExportError naming the field and the
expected value. All of it happens in a temporary sibling of OUT renamed into place at the end, so OUT is a whole
validated export or as it was; an earlier export in OUT is replaced only with `overwrite=True`
(serve/export/destination.py). `scripts/check_engines.py` runs the engines' own loaders on these folders.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from draftsmith.serve.core.whole_folder import whole_folder
from draftsmith.serve.drafters.folder import read_config as read_native_config
from draftsmith.serve.export.common import ExportError, target_facts
from draftsmith.serve.export.formats import FORMATS, export_format
from draftsmith.serve.export.report import ExportReport, readme
from draftsmith.serve.export.validate import validate_export
from draftsmith.serve.export.destination import check_destination
from draftsmith.serve.export.write import README_NAME, REPORT_NAME, check_export, write_export, write_files
from draftsmith.serve.core.target import Target
from draftsmith.serve.methods.registry import method

__all__ = ["FORMATS", "ExportError", "ExportReport", "check_export", "export_drafter", "validate_export",
           "write_export"]


def export_drafter(native_dir: str | Path, fmt: str, out_dir: str | Path, *, target: Target, target_spec: str | None = None,
                   verifier: str | None = None, engine_version: str | None = None, prompts=None, k: int | None = None,
                   max_new_tokens: int = 32, overwrite: bool = False) -> ExportReport:
    """Write, validate and document one export, whole or not at all; returns the report (also written to
    OUT/export_report.json)."""
    config = read_native_config(native_dir)
    merged = method(config.method, what="drafter method", trained=True).merge_export
    if merged is not None:  # exported into the target's checkpoint (MTP)
        return merged(native_dir, fmt, out_dir, target=target, prompts=prompts, k=k, max_new_tokens=max_new_tokens,
                      overwrite=overwrite)
    module = export_format(fmt)
    facts = target_facts(target, verifier=verifier)
    check_export(native_dir, fmt, target=target, engine_version=engine_version)
    replaced = check_destination(out_dir, overwrite=overwrite)
    out = Path(out_dir)
    with whole_folder(out, replace=overwrite) as folder:
        t0 = time.perf_counter()
        write_files(native_dir, fmt, folder, target=target, verifier=verifier)
        report = ExportReport(format=fmt, method=config.method, out_dir=str(out), target=target.name,
                              native_dir=str(Path(native_dir)), export_seconds=time.perf_counter() - t0,
                              engine_version=engine_version or "", notes=module.notes(config, facts),
                              replaced=replaced or "")
        t1 = time.perf_counter()
        validate_export(folder, fmt, native_dir=native_dir, target=target, prompts=prompts, k=k,
                        max_new_tokens=max_new_tokens, verifier=verifier, report=report, shown_as=out)
        report.validate_seconds = time.perf_counter() - t1
        (folder / REPORT_NAME).write_text(json.dumps(report.to_dict(), indent=2) + "\n")
        (folder / README_NAME).write_text(readme(config, report, module=module, out=out, target=target, facts=facts,
                                                 target_spec=target_spec))
    return report
