"""The `draftsmith_export` entry every exported config.json carries: what was exported, for which target.

Engines ignore unknown config keys; the read-back uses the target hashes to refuse another target, and a
person reading config.json sees both layer-id conventions side by side.
"""
from __future__ import annotations

from pathlib import Path

from draftsmith.serve.drafters.head_config import HeadConfig
from draftsmith.serve.export.common import PROVENANCE_KEY
from draftsmith.serve.export.layer_ids import CONVENTIONS

FORMAT_VERSION = 1
FINAL_FEATURE = "final normed hidden state of the target (draftsmith FINAL=-1), what the engines feed EAGLE-1/Medusa"


def provenance(config: HeadConfig, *, fmt: str, engine: str, engine_layer_ids: list[int] | None,
               native_dir: str | Path) -> dict:
    entry = {"version": FORMAT_VERSION, "format": fmt, "method": config.method,
             "num_speculative_tokens": config.num_speculative_tokens, "target_name": config.target_name,
             "target_config_hash": config.target_config_hash, "target_tokenizer_hash": config.target_tokenizer_hash,
             "native_drafter": str(Path(native_dir).resolve())}
    if engine_layer_ids is None:
        entry["feature"] = FINAL_FEATURE
    else:
        entry["aux_layer_ids"] = {"draftsmith": list(config.aux_layer_ids), engine: list(engine_layer_ids),
                                  "draftsmith_convention": CONVENTIONS["draftsmith"],
                                  f"{engine}_convention": CONVENTIONS[engine]}
    return {PROVENANCE_KEY: entry}


def target_identity(config: dict) -> dict:
    """The target hashes a draftsmith export recorded (empty strings for folders written elsewhere)."""
    entry = config.get(PROVENANCE_KEY) or {}
    return {"target_name": entry.get("target_name", ""), "target_config_hash": entry.get("target_config_hash", ""),
            "target_tokenizer_hash": entry.get("target_tokenizer_hash", "")}
