"""The export formats by name. Each module (vllm, sglang, speculators) has the same parts, one per stage:

    NAME, ENGINE, METHODS
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

from types import ModuleType

from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.export import sglang, speculators, vllm

FORMATS: dict[str, ModuleType] = {"vllm": vllm, "sglang": sglang, "speculators": speculators}


def format_module(fmt: str) -> ModuleType:
    if fmt not in FORMATS:
        raise DraftsmithError(f"unknown export format {fmt!r}; choose one of {', '.join(FORMATS)}")
    return FORMATS[fmt]
