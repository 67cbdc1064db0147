"""Read an exported folder back into a draftsmith Drafter the way its engine would read it.

Each format's `read` (next to its writer) interprets config.json and the tensors with the ENGINE's rules and
defaults (aux-layer convention, architectures, flags and their defaults, tensor names it loads, tensors it
ignores), never with the draftsmith provenance entry, so a folder the engine would misread gives a drafter
that drafts differently (or a reader error naming the field). The target hashes recorded by draftsmith, when
present, still refuse another target.
"""
from __future__ import annotations

from pathlib import Path

import torch

from draftsmith.serve.drafters.base import Drafter
from draftsmith.serve.drafters.folder import build_head, make_drafter
from draftsmith.serve.drafters.identity import check_target_identity
from draftsmith.serve.export.common import ExportError, read_config, read_tensors
from draftsmith.serve.export.formats import FORMATS
from draftsmith.serve.export.provenance import target_identity
from draftsmith.serve.core.target import Target, text_config


def read_export(path: str | Path, target: Target, *, fmt: str, attn_implementation: str = "sdpa") -> Drafter:
    """The Drafter `fmt`'s engine would build from the folder `path`, serving `target`."""
    head = read_head(path, target, fmt=fmt, attn_implementation=attn_implementation)
    return make_drafter(head, target)


def read_head(path: str | Path, target: Target, *, fmt: str, attn_implementation: str = "sdpa") -> torch.nn.Module:
    if fmt not in FORMATS:
        raise ExportError(f"unknown export format {fmt!r}; choose one of {', '.join(FORMATS)}")
    config, tensors = read_config(path), read_tensors(path)
    where = f"{fmt} export {path}"
    head_config, state = FORMATS[fmt].read(config, tensors, num_layers=text_config(target.config).num_hidden_layers,
                                           where=where)
    for key, value in target_identity(config).items():
        setattr(head_config, key, value)
    if head_config.layer_config:
        head_config.layer_config["_attn_implementation"] = attn_implementation
    check_target_identity(head_config, target)
    head = build_head(head_config)
    missing, _ = head.load_state_dict(state, strict=False)  # names the engine does not load are ignored, as there
    if missing:
        raise ExportError(f"{where}: {head_config.method} needs tensor {sorted(missing)[0]!r}, which the engine "
                          f"would not find (it would keep a random initialization)")
    return head
