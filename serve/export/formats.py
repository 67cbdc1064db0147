"""The export formats by name. A format is an engine's (vllm, sglang, speculators: its name, its engine and the
command that serves a drafter in it); what a method exports to it is the method's own (serve/methods/<name>/, a
FormatExport of serve/export/method_export.py), one part per stage:

    check_exportable(config)                   refuse a drafter no release of the engine can load (before writing)
    support(config) -> engines.Support         the engine releases that load it (`--engine-version` is checked)
    build(state, config, facts)                -> (config.json body, tensors)               the writer
    expected(config, facts) -> FormatSpec      what the engine reads, from its source       the validator
    check_extra(config_json) -> [problem]      what a FormatSpec cannot express
    read(config_json, tensors, num_layers=, where=) -> (HeadConfig, state)   the engine-faithful reader
    usage / notes                              the serving command and version notes for OUT/README.md
    package_check(out, target, head, where=)   the engine's own package, when it can run beside draftsmith
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.export import sglang, speculators, vllm
from draftsmith.serve.export.common import ExportError, FormatSpec, TargetFacts
from draftsmith.serve.export.engines import Support
from draftsmith.serve.export.method_export import FormatExport, format_exports, method_export
from draftsmith.serve.core.target import Target


@dataclass(frozen=True)
class EngineFormat:
    NAME: str
    ENGINE: str
    serving: Callable[..., str]  # (serve_as, *, k, out, facts, options) -> the serving command, Markdown

    def form(self, config) -> FormatExport:
        """The drafter's method's form in this format; one line naming the formats it has when none."""
        return method_export(config.method, self.NAME, self.ENGINE)

    def check_exportable(self, config) -> None:
        self.form(config).check(config)

    def support(self, config) -> Support:
        return self.form(config).support(config)

    def build(self, state: dict, config, facts: TargetFacts) -> tuple[dict, dict]:
        form = self.form(config)
        form.check(config)
        return form.build(state, config, facts)

    def expected(self, config, facts: TargetFacts) -> FormatSpec:
        return self.form(config).expected(config, facts)

    def check_extra(self, config_json: dict) -> list[str]:
        return [problem for form in format_exports(self.NAME) for problem in form.check_extra(config_json)]

    def read(self, config_json: dict, tensors: dict, *, num_layers: int, where: str):
        """The head the engine builds from the folder (its rules and defaults, never the draftsmith provenance)."""
        forms = [form for form in format_exports(self.NAME) if form.claims(config_json)]
        archs = list(config_json.get("architectures") or [])
        if not forms:
            known = [a for form in format_exports(self.NAME) for a in form.architectures]
            raise ExportError(f"{where}: architectures {archs} is no {self.ENGINE} draft model of --format "
                              f"{self.NAME}; expected one of {', '.join(known)}")
        if len(forms) > 1:
            raise ExportError(f"{where}: architectures {archs} and model_type {config_json.get('model_type')!r} "
                              f"read as two draft models ({', '.join(f.architectures[0] for f in forms)}); expected "
                              f"one")
        return forms[0].read(config_json, tensors, num_layers=num_layers, where=where)

    def usage(self, config, *, out: str, facts: TargetFacts) -> str:
        form = self.form(config)
        return self.serving(form.serve_as, k=config.num_speculative_tokens, out=out, facts=facts,
                            options=dict(form.serve_options))

    def notes(self, config, facts: TargetFacts) -> list[str]:
        return self.form(config).notes(config, facts)

    def package_check(self, out, target: Target, head, *, where: str) -> str:
        return self.form(head.config).package_check(out, target, head, where=where)


FORMATS: dict[str, EngineFormat] = {module.NAME: EngineFormat(module.NAME, module.ENGINE, module.usage)
                                    for module in (vllm, sglang, speculators)}


def export_format(fmt: str) -> EngineFormat:
    if fmt not in FORMATS:
        raise DraftsmithError(f"unknown export format {fmt!r}; choose one of {', '.join(FORMATS)}")
    return FORMATS[fmt]
