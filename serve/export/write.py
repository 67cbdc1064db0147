"""Write a native drafter folder in an engine's format: config.json + model.safetensors, nothing validated yet.

Everything that can refuse the export (a drafter the engine cannot load, an engine version that lacks what it
needs, another target, a folder holding other weights) runs before the first file is written.
"""
from __future__ import annotations

import json
from pathlib import Path

from serve.drafters.folder import CHECKSUMS_NAME, load_head, read_config as read_native_config, write_weights
from serve.drafters.identity import check_target_identity
from serve.core.errors import DraftsmithError
from serve.export.common import CONFIG_NAME, WEIGHTS_NAME, target_facts
from serve.core.files import write_text_atomic
from serve.export.engines import refuse_unless_supported
from serve.export.formats import format_module
from serve.export.hosts import check_hosted
from serve.export.layer_ids import aux_layer_ids_for
from serve.export.provenance import provenance

README_NAME = "README.md"
REPORT_NAME = "export_report.json"


def check_export(native_dir: str | Path, fmt: str, *, target=None, engine_version: str | None = None) -> None:
    """Raise (DraftsmithError, with the reason and the fix) if `fmt` cannot carry this drafter, or the named
    engine version cannot load it; writes nothing."""
    module = format_module(fmt)
    config = read_native_config(native_dir)
    if target is not None:
        check_target_identity(config, target)
    module.check_exportable(config)
    check_hosted(config.method, config.target_model_type, fmt, engine_version)
    refuse_unless_supported(module.support(config), engine_version, what=f"a {config.method} drafter in --format {fmt}")


def write_export(native_dir: str | Path, fmt: str, out_dir: str | Path, *, target, verifier: str | None = None,
                 engine_version: str | None = None) -> Path:
    """Write config.json + model.safetensors of `fmt` for the native drafter folder; no validation."""
    check_export(native_dir, fmt, target=target, engine_version=engine_version)
    module = format_module(fmt)
    config = read_native_config(native_dir)
    facts = target_facts(target, verifier=verifier)
    body, tensors = module.build(load_head(native_dir).state_dict(), config, facts)
    out = _fresh_folder(out_dir)
    body.update(provenance(config, fmt=fmt, engine=fmt,
                           engine_layer_ids=aux_layer_ids_for(config, module.NAME, facts.num_layers),
                           native_dir=native_dir))
    write_weights(tensors, out, metadata={"format": "pt"})
    write_text_atomic(out / CONFIG_NAME, json.dumps(body, indent=2) + "\n")
    return out


def _fresh_folder(out_dir: str | Path) -> Path:
    """OUT without a previous export's files; refuses other weights an engine might pick up too."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name in (CONFIG_NAME, WEIGHTS_NAME, CHECKSUMS_NAME, README_NAME, REPORT_NAME):
        (out / name).unlink(missing_ok=True)
    foreign = sorted(p.name for p in out.iterdir() if p.suffix in (".safetensors", ".bin", ".pt", ".pth", ".gguf")
                     or p.name.endswith(".index.json"))
    if foreign:
        raise DraftsmithError(f"{out} already holds {foreign}; an engine could load those too: export into an empty "
                              f"folder")
    return out
