"""Write a native drafter folder in an engine's format: config.json + model.safetensors, nothing validated yet.

Everything that can refuse the export (a drafter the engine cannot load, an engine version that lacks what it
needs, another target, an out folder that holds anything but an earlier export, or one without `overwrite`) runs
before the first file is written; the folder is written whole in a temporary sibling and renamed into place
(serve/core/whole_folder.py), so a failed export leaves the destination as it was.
"""
from __future__ import annotations

import json
from pathlib import Path

from draftsmith.serve.drafters.folder import load_head, read_config as read_native_config, write_weights
from draftsmith.serve.drafters.identity import check_target_identity
from draftsmith.serve.export.common import CONFIG_NAME, target_facts
from draftsmith.serve.core.files import write_text_atomic
from draftsmith.serve.core.whole_folder import whole_folder
from draftsmith.serve.export.destination import README_NAME, REPORT_NAME, check_destination
from draftsmith.serve.export.engines import refuse_unless_supported
from draftsmith.serve.export.formats import export_format
from draftsmith.serve.export.hosts import check_hosted
from draftsmith.serve.export.layer_ids import aux_layer_ids_for
from draftsmith.serve.export.provenance import provenance
from draftsmith.serve.core.target import Target
from draftsmith.serve.methods.registry import method

__all__ = ["README_NAME", "REPORT_NAME", "check_export", "write_export", "write_files"]


def check_export(native_dir: str | Path, fmt: str, *, target: Target | None=None, engine_version: str | None = None) -> None:
    """Raise (DraftsmithError, with the reason and the fix) if `fmt` cannot carry this drafter, or the named
    engine version cannot load it; writes nothing."""
    module = export_format(fmt)
    config = read_native_config(native_dir)
    if target is not None:
        check_target_identity(config, target)
    merged = method(config.method, what="drafter method", trained=True).merge_check
    if merged is not None:  # exported into the target's checkpoint (MTP)
        merged(config, fmt)
        return
    module.check_exportable(config)
    check_hosted(module.form(config).hosted_as, config.target_model_type, fmt, engine_version,
                 tied=None if target is None else lm_head_tied(target))
    refuse_unless_supported(module.support(config), engine_version, what=f"a {config.method} drafter in --format {fmt}")


def lm_head_tied(target: Target) -> bool:
    """Whether the target's lm_head is its embedding matrix (one tensor), as an engine serving only tied checkpoints
    of a family needs (serve/core/families.py `untied`)."""
    output = target.model.get_output_embeddings()
    return output is not None and output.weight is target.model.get_input_embeddings().weight


def write_export(native_dir: str | Path, fmt: str, out_dir: str | Path, *, target: Target, verifier: str | None = None,
                 engine_version: str | None = None, overwrite: bool = False) -> Path:
    """Write config.json + model.safetensors of `fmt` for the native drafter folder into `out_dir`, whole or not at
    all; no validation. An earlier export there is replaced only with `overwrite` (check_destination)."""
    check_export(native_dir, fmt, target=target, engine_version=engine_version)
    check_destination(out_dir, overwrite=overwrite)
    with whole_folder(out_dir, replace=overwrite) as folder:
        write_files(native_dir, fmt, folder, target=target, verifier=verifier)
    return Path(out_dir)


def write_files(native_dir: str | Path, fmt: str, folder: Path, *, target: Target, verifier: str | None = None) -> None:
    """config.json + model.safetensors of `fmt` in `folder` (an empty folder the caller renames into place)."""
    module = export_format(fmt)
    config = read_native_config(native_dir)
    facts = target_facts(target, verifier=verifier)
    body, tensors = module.build(load_head(native_dir).state_dict(), config, facts)
    body.update(provenance(config, fmt=fmt, engine=fmt,
                           engine_layer_ids=aux_layer_ids_for(config, module.NAME, facts.num_layers),
                           native_dir=native_dir))
    write_weights(tensors, folder, metadata={"format": "pt"})
    write_text_atomic(folder / CONFIG_NAME, json.dumps(body, indent=2) + "\n")
