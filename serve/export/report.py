"""What an export reports: ExportReport (OUT/export_report.json, `draftsmith export --json`) and OUT/README.md."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType

from draftsmith.serve.drafters.head_config import HeadConfig
from draftsmith.serve.export.common import TargetFacts
from draftsmith.serve.core.target import Target


@dataclass
class ExportReport:
    format: str
    method: str
    out_dir: str
    target: str
    native_dir: str = ""
    export_seconds: float = 0.0
    validate_seconds: float = 0.0
    mu_native: float = 0.0
    mu_readback: float = 0.0
    prompts: int = 0
    cycles: int = 0
    proposals_compared: int = 0
    k: int = 0
    layer_ids: dict = field(default_factory=dict)
    package_check: str = ""      # the engine's own package loading the folder, where it runs beside draftsmith
    engine_version: str = ""     # the engine release the export was checked against (--engine-version), if named
    replaced: str = ""           # the earlier export this one replaced (--overwrite), if any
    checks: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # engine versions and serving caveats, also in README.md

    def to_dict(self) -> dict:
        return asdict(self)


def readme(config: HeadConfig, report: ExportReport, *, module: ModuleType, out: Path, target: Target, facts: TargetFacts,
           target_spec: str | None) -> str:
    lines = [f"# {config.method} drafter for {target.name}, {report.format} format", "",
             f"Exported by draftsmith from the native drafter `{report.native_dir}`, trained for the target "
             f"**{target.name}** "
             f"(weights read from `{target.path}`; tokenizer hash `{config.target_tokenizer_hash}`, config hash "
             f"`{config.target_config_hash}`). Serve it with that target only.", "",
             "## Serve it", "", module.usage(config, out=str(out.resolve()), facts=facts).rstrip(), ""]
    if facts.verifier != target.name:
        lines += [f"`{facts.verifier}` is the exact target the drafter was trained against; `{target.name}` names it.",
                  ""]
    if report.notes:
        lines += ["## Engine versions", ""] + [f"- {note}" for note in report.notes] + [""]
    if report.layer_ids:
        fmt_ids = report.layer_ids[report.format]
        lines += ["## Aux layers", "",
                  f"draftsmith ids {report.layer_ids['draftsmith']} (outputs of decoder layers) are written as "
                  f"{fmt_ids} in {report.format}'s convention (see `draftsmith_export.aux_layer_ids` in config.json).",
                  ""]
        if report.layer_ids["draftsmith"] != sorted(report.layer_ids["draftsmith"]):
            lines += ["Engines concatenate aux states in ascending layer order whatever order the config lists, so "
                      "the ids are written sorted and fc.weight's column blocks were permuted to match.", ""]
    lines += ["## Validation", "",
              f"Checked in {report.validate_seconds:.1f} s (export {report.export_seconds:.1f} s):", ""]
    lines += [f"- {c}" for c in report.checks]
    lines += ["", f"μ native {report.mu_native:.3f}, μ read back {report.mu_readback:.3f} (K={report.k}, greedy, "
              f"{report.prompts} prompts, {report.cycles} cycles, draftsmith's decoder).", ""]
    if target_spec:
        lines += ["Re-run export and validation:", "", f"```bash\ndraftsmith export --drafter {report.native_dir} "
                  f"--format {report.format} --out {out} --target {target_spec}\n```", ""]
    return "\n".join(lines)
