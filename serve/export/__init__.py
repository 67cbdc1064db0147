"""Export a native drafter folder for a serving engine, then prove the engine would read it as trained.

    report = export_drafter("runs/x/drafter", "vllm", "exports/x-vllm", target=target)

writes OUT/config.json + OUT/model.safetensors in the engine's format, validates them (serve/export/common.py),
reads the folder back through that format's reader (serve/export/readback.py), runs it next to the native drafter
in the speculative decoder, and writes OUT/README.md (serving command, target, validation figures) and
OUT/export_report.json. Any failed check raises ExportError naming the field and the expected value.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from safetensors.torch import save_file

from serve.drafters.folder import load_head, make_drafter, read_config as read_native_config
from serve.drafters.heads_common import HeadConfig, check_target_identity, text_config_of
from serve.errors import DraftsmithError
from serve.export import sglang, speculators, vllm
from serve.export.common import (CONFIG_NAME, WEIGHTS_NAME, ExportError, check_config, check_layer_ids,
                                 check_no_untrained_embeddings, check_tensors, compare_drafts, default_prompts,
                                 read_config, read_tensors)
from serve.export.layer_ids import aux_layer_ids_for
from serve.export.provenance import provenance
from serve.export.readback import read_head

FORMATS = {"vllm": vllm, "sglang": sglang, "speculators": speculators}
README_NAME = "README.md"
REPORT_NAME = "export_report.json"

__all__ = ["FORMATS", "ExportError", "ExportReport", "export_drafter", "validate_export"]


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
    speculators_package: str = ""
    checks: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def _format(fmt: str):
    if fmt not in FORMATS:
        raise DraftsmithError(f"unknown export format {fmt!r}; choose one of {', '.join(FORMATS)}")
    return FORMATS[fmt]


def _verifier_ref(target) -> str:
    """What a serving engine should load as the target: its local folder when there is one, else its name."""
    path = Path(target.path)
    return str(path.resolve()) if path.is_dir() else target.name


def write_export(native_dir: str | Path, fmt: str, out_dir: str | Path, *, target, verifier: str | None = None) -> Path:
    """Write config.json + model.safetensors of `fmt` for the native drafter folder; no validation."""
    module = _format(fmt)
    config = read_native_config(native_dir)
    check_target_identity(config, target)
    num_layers = text_config_of(target.config).num_hidden_layers
    state = load_head(native_dir).state_dict()
    if fmt == "speculators":
        body, tensors = module.build(state, config, num_layers=num_layers, verifier=verifier or _verifier_ref(target),
                                     verifier_architectures=list(getattr(target.config, "architectures", None) or []))
    else:
        body, tensors = module.build(state, config, num_layers=num_layers)
    out = _fresh_folder(out_dir)
    body.update(provenance(config, fmt=fmt, engine=fmt, engine_layer_ids=body_layer_ids(module, config, num_layers),
                           native_dir=native_dir))
    (out / CONFIG_NAME).write_text(json.dumps(body, indent=2) + "\n")
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / WEIGHTS_NAME), metadata={"format": "pt"})
    return out


def _fresh_folder(out_dir: str | Path) -> Path:
    """OUT without a previous export's files; refuses other weights an engine might pick up too."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name in (CONFIG_NAME, WEIGHTS_NAME, README_NAME, REPORT_NAME):
        (out / name).unlink(missing_ok=True)
    foreign = sorted(p.name for p in out.iterdir() if p.suffix in (".safetensors", ".bin", ".pt", ".pth", ".gguf")
                     or p.name.endswith(".index.json"))
    if foreign:
        raise DraftsmithError(f"{out} already holds {foreign}; an engine could load those too: export into an empty "
                              f"folder")
    return out


def body_layer_ids(module, config: HeadConfig, num_layers: int) -> list[int] | None:
    return aux_layer_ids_for(config, module.NAME, num_layers)


def validate_export(out_dir: str | Path, fmt: str, *, native_dir: str | Path, target, prompts=None,
                    k: int | None = None, max_new_tokens: int = 32, verifier: str | None = None, report: ExportReport | None = None
                    ) -> ExportReport:
    """Check an exported folder against the engine's schema, then read it back and draft next to the native."""
    module = _format(fmt)
    out = Path(out_dir)
    where = f"{fmt} export {out}"
    config = read_native_config(native_dir)
    report = report or ExportReport(format=fmt, method=config.method, out_dir=str(out), target=target.name)
    exported, tensors = read_config(out), read_tensors(out)
    spec = (module.expected(config, target, verifier=verifier) if fmt == "speculators"
            else module.expected(config, target))
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
    if config.method == "eagle3":
        check_layer_ids(exported, spec, native_ids=list(config.aux_layer_ids), engine=fmt, where=where)
        report.layer_ids = {"draftsmith": list(config.aux_layer_ids), fmt: list(spec.engine_layer_ids)}
        report.checks.append(f"aux layer ids {config.aux_layer_ids} (draftsmith) -> {spec.engine_layer_ids} ({fmt})")

    attn = config.layer_config.get("_attn_implementation", "sdpa") if config.layer_config else "sdpa"
    head = read_head(out, target, fmt=fmt, attn_implementation=attn)
    if fmt == "speculators":
        if speculators.package_available():
            report.speculators_package = speculators.check_with_package(out, target, head, where=where)
        else:
            report.speculators_package = "not installed: validated against the schema in serve/export/speculators.py"
        report.checks.append(report.speculators_package)
    weight = target.model.get_input_embeddings().weight
    native = make_drafter(load_head(native_dir, device=weight.device, dtype=weight.dtype), target)
    readback = make_drafter(head.to(device=weight.device, dtype=weight.dtype), target)
    k = k or (min(config.num_speculative_tokens, 5) if config.method != "medusa" else config.num_speculative_tokens)
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


def export_drafter(native_dir: str | Path, fmt: str, out_dir: str | Path, *, target, target_spec: str | None = None,
                   verifier: str | None = None, prompts=None, k: int | None = None, max_new_tokens: int = 32
                   ) -> ExportReport:
    """Write, validate and document one export; returns the report (also written to OUT/export_report.json)."""
    config = read_native_config(native_dir)
    t0 = time.perf_counter()
    out = write_export(native_dir, fmt, out_dir, target=target, verifier=verifier)
    report = ExportReport(format=fmt, method=config.method, out_dir=str(out), target=target.name,
                          native_dir=str(Path(native_dir)), export_seconds=time.perf_counter() - t0)
    t1 = time.perf_counter()
    validate_export(out, fmt, native_dir=native_dir, target=target, prompts=prompts, k=k,
                    max_new_tokens=max_new_tokens,
                    verifier=verifier or (_verifier_ref(target) if fmt == "speculators" else None), report=report)
    report.validate_seconds = time.perf_counter() - t1
    (out / REPORT_NAME).write_text(json.dumps(report.to_dict(), indent=2) + "\n")
    (out / README_NAME).write_text(readme(config, report, module=_format(fmt), out=out, target=target,
                                          target_spec=target_spec))
    return report


def readme(config: HeadConfig, report: ExportReport, *, module, out: Path, target, target_spec: str | None) -> str:
    target_ref = _verifier_ref(target)
    lines = [f"# {config.method} drafter for {target.name}, {report.format} format", "",
             f"Exported by draftsmith from the native drafter `{report.native_dir}`, trained for the target "
             f"**{target.name}** "
             f"(weights read from `{target.path}`; tokenizer hash `{config.target_tokenizer_hash}`, config hash "
             f"`{config.target_config_hash}`). Serve it with that target only.", "",
             "## Serve it", "", module.usage(config, out=str(out.resolve()), target_ref=target_ref).rstrip(), ""]
    if target_ref != target.name:
        lines += [f"`{target_ref}` is the exact target the drafter was trained against; `{target.name}` names it.", ""]
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
