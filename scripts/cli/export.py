"""`draftsmith export --drafter DIR --format vllm|sglang|speculators --out OUT [--target T]`.

Writes the drafter in the engine's format, validates it (schema, tensors, layer ids, read back and drafted
next to the native drafter) and prints the report; OUT/README.md holds the serving command.
"""
from __future__ import annotations

import json

_FLAGS = ("drafter", "format", "out", "overwrite", "target", "verifier", "engine_version", "dtype", "prompts",
          "max_new_tokens", "k")


def add_arguments(parser) -> None:
    parser.add_argument("--drafter", help="native drafter folder (draftsmith train output)")
    parser.add_argument("--format", choices=("vllm", "sglang", "speculators"),
                        help="vllm: EAGLE-1/EAGLE-3, and Medusa for vLLM 0.15-0.32 only (vLLM 0.33 has no Medusa; "
                             "full-vocabulary heads only); sglang: EAGLE-1/EAGLE-3; speculators: EAGLE-3 for vLLM")
    parser.add_argument("--out", help="folder to write the export to: a new or empty one, or one holding an earlier "
                                      "export with --overwrite (written whole in a temporary sibling, then renamed "
                                      "into place)")
    parser.add_argument("--overwrite", action="store_true", default=None,
                        help="replace the earlier export --out holds (a folder with other files is still refused)")
    parser.add_argument("--target", help="the drafter's target (default: the one it was trained with)")
    parser.add_argument("--verifier", help="speculators: verifier name_or_path written for vLLM (default: the "
                                           "target's local folder)")
    parser.add_argument("--engine-version", help="the engine release you will serve with (vLLM for vllm/"
                                                 "speculators, SGLang for sglang), e.g. 0.33.0: an export it cannot "
                                                 "load is refused before anything is written")
    parser.add_argument("--dtype", help="target dtype for validation (default float32)")
    parser.add_argument("--prompts", type=int, help="validation prompts (default 3)")
    parser.add_argument("--max-new-tokens", type=int, help="tokens per validation prompt (default 32)")
    parser.add_argument("--k", type=int, help="draft tokens per validation cycle (default: the drafter's K, <= 5)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args) -> int:
    from draftsmith.serve.core.config import load_config
    from draftsmith.serve.core.files import check_output_path
    from draftsmith.serve.drafters.folder import verify_weights
    from draftsmith.serve.export import check_export, export_drafter
    from draftsmith.serve.export.common import default_prompts
    from draftsmith.serve.export.config import ExportConfig, check, trained_target
    from draftsmith.serve.export.destination import check_destination
    from draftsmith.serve.core.target import load_configured

    flags = [f"{name}={getattr(args, name)}" for name in _FLAGS if getattr(args, name, None) is not None]
    config = check(load_config(ExportConfig, config_file=args.config, overrides=[*args.overrides, *flags]))
    # everything that can refuse runs before the target loads; nothing is written until the export is whole
    check_output_path(config.out, what="export folder", folder=True)
    check_destination(config.out, overwrite=config.overwrite)
    check_export(config.drafter, config.format, engine_version=config.engine_version or None)
    verify_weights(config.drafter)
    config.target.spec = config.target.spec or trained_target(config.drafter)
    config.target.apply_threads()
    target = load_configured(config.target)
    report = export_drafter(config.drafter, config.format, config.out, target=target, target_spec=config.target.spec,
                            verifier=config.verifier or None, engine_version=config.engine_version or None,
                            prompts=default_prompts(target, count=config.prompts),
                            k=config.k or None, max_new_tokens=config.max_new_tokens, overwrite=config.overwrite)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
        return 0
    print(f"{report.method} -> {report.format}: {report.out_dir}"
          + (f" (replaced {report.replaced})" if report.replaced else ""))
    for line in report.checks:
        print(f"  ok  {line}")
    for line in report.notes:
        print(f"  note  {line}")
    print(f"  export {report.export_seconds:.2f}s, validation {report.validate_seconds:.1f}s; "
          f"mu native {report.mu_native:.3f} = read back {report.mu_readback:.3f}; serving command in "
          f"{report.out_dir}/README.md")
    return 0
