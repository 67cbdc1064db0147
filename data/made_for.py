"""Which target a dataset or hidden-state cache was made for, and the refusal when a run's target is another.

A record fingerprints the target: its tokenizer (what token ids mean), its config (architecture), its weights
(serve/core/identity.weights_fingerprint) and its hidden size. A run's target is compared with the record before
any weight is loaded (`probe_target` reads only the config and the tokenizer):

- another tokenizer or hidden size is always refused: the token ids or the hidden states cannot be right;
- another config or other weights (the same tokenizer and width) is refused unless `allow_other`, for a fine-tune
  of the same base trained on the base's data; `check_made_for` then returns a note saying so.

Fields a record lacks (data made by an earlier version) are not compared.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TYPE_CHECKING

from draftsmith.serve.core.errors import DraftsmithError

if TYPE_CHECKING:  # annotations only: the target's module imports torch
    from draftsmith.serve.core.target import Target

ALLOW_FLAG = "--allow-other-target"


@dataclass(frozen=True)
class TargetRecord:
    name: str
    tokenizer_hash: str = ""
    config_hash: str = ""
    weights: str = ""  # weights_fingerprint; "" = unknown (a hub id, or an earlier record)
    hidden_size: int = 0  # 0 = unknown

    @classmethod
    def of(cls, target: Target) -> "TargetRecord":
        """The record of a loaded draftsmith.serve.core.target.Target (with or without its weights)."""
        from draftsmith.serve.core.identity import weights_fingerprint
        from draftsmith.serve.core.target import text_config

        where = Path(target.name) if Path(target.name).is_file() else Path(target.path)  # a .gguf: that file alone
        return cls(name=target.name, tokenizer_hash=target.tokenizer_hash, config_hash=target.config_hash,
                   weights=weights_fingerprint(where), hidden_size=int(text_config(target.config).hidden_size))

    @classmethod
    def from_json(cls, data: dict) -> "TargetRecord":
        return cls(name=str(data.get("name") or "an unnamed target"), tokenizer_hash=data.get("tokenizer_hash") or "",
                   config_hash=data.get("config_hash") or "", weights=data.get("weights") or "",
                   hidden_size=int(data.get("hidden_size") or 0))

    def to_json(self) -> dict:
        return asdict(self)


def probe_target(spec: str) -> Any:
    """The target `spec` names, config and tokenizer only (seconds, whatever its size): enough for its record."""
    from draftsmith.serve.core.target import load_target

    return load_target(spec, weights=False)


def dataset_record(folder: str | Path) -> TargetRecord | None:
    """The target a `data build` folder records in build_info.json; None when it records none (made elsewhere)."""
    path = Path(folder) / "build_info.json"
    if not path.is_file():
        return None
    try:
        target = json.loads(path.read_text()).get("target")
    except json.JSONDecodeError as err:
        raise DraftsmithError(f"{path} is not valid JSON ({err.msg}); rebuild the dataset with `draftsmith data "
                              f"build`") from None
    return TargetRecord.from_json(target) if isinstance(target, dict) else None


def cache_record(folder: str | Path) -> TargetRecord | None:
    """The target a `data capture` cache records in its manifest; None when there is no manifest (the reader then
    says what is wrong with the folder)."""
    path = Path(folder) / "manifest.json"
    if not path.is_file():
        return None
    try:
        target = json.loads(path.read_text()).get("target")
    except json.JSONDecodeError:
        return None  # CacheReader names the broken manifest
    return TargetRecord.from_json(target) if isinstance(target, dict) else None


def differences(made: TargetRecord, run: TargetRecord) -> list[tuple[str, str, str]]:
    """(field, as `made` records it, as `run` has it) for each field both know and that differs."""
    pairs = (("tokenizer", made.tokenizer_hash, run.tokenizer_hash),
             ("hidden size", made.hidden_size, run.hidden_size),
             ("config", made.config_hash, run.config_hash),
             ("weights", made.weights, run.weights))
    return [(label, _shown(label, a), _shown(label, b)) for label, a, b in pairs if a and b and a != b]


def _shown(label: str, value: str | int) -> str:
    return f"{label} {value}" if label == "hidden size" else f"{label} sha {value}"


def describe(made: TargetRecord, run: TargetRecord, what: str) -> str:
    """'<what> for target X (config sha a) but this run's target is Y (config sha b)'; "" when they agree."""
    fields = differences(made, run)
    if not fields:
        return ""
    return (f"{what} for target {made.name!r} ({', '.join(f[1] for f in fields)}) but this run's target is "
            f"{run.name!r} ({', '.join(f[2] for f in fields)})")


def check_made_for(made: TargetRecord, run: TargetRecord, *, what: str, remake: str,
                   allow_other: bool = False) -> str | None:
    """None when `run` is the target `made` records; with `allow_other`, a note when it is another target of the
    same tokenizer and hidden size; DraftsmithError (one line naming both targets) otherwise.

    what: the subject, e.g. "data/ds was built" or "the cache c was captured"; remake: the command that makes one
    for `run`, e.g. "rebuild it with `draftsmith data build --target Y ...`"."""
    line = describe(made, run, what)
    if not line:
        return None
    hard = [label for label, _, _ in differences(made, run) if label in ("tokenizer", "hidden size")]
    if "tokenizer" in hard:
        raise DraftsmithError(f"{line}: its token ids mean other text to this target; {remake} ({ALLOW_FLAG} "
                              f"cannot help: the tokenizers differ)")
    if hard:
        raise DraftsmithError(f"{line}: this target is no fine-tune of that one; {remake} ({ALLOW_FLAG} cannot "
                              f"help: the hidden sizes differ)")
    if not allow_other:
        raise DraftsmithError(f"{line}; {remake}, or pass {ALLOW_FLAG} if {run.name!r} is a fine-tune of "
                              f"{made.name!r}")
    return f"note: {line}; used anyway ({ALLOW_FLAG}: same tokenizer and hidden size)"
