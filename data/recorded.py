"""The hidden states `data build --capture` keeps while the target answers, until they become the cache.

Each part of a build's work folder (data/build.py: `.work/part-NNNNN.jsonl`, its finished rows) gets a states file
written before it, `.work/part-NNNNN.states.safetensors`:
    {k}.input_ids              (T,) int32     row k's tokens (its last prompt + answer, as the target read them)
    {k}.target_top1            (T,) int32     the target's argmax after each token
    {k}.hidden_states.<id>     (T, h)         per recorded layer id (hidden_states.final for id -1)
    metadata["draftsmith"]: JSON {format, ids, layers, dtype, target}
A part whose states file is missing (a kill between the two writes, a build without --capture) or was recorded at
other layers, dtype or target weights has its rows forwarded again by the capture (data/capture.py), as are rows
whose dataset tokens are not the tokens the target read (a conversation re-rendered, a truncated row).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

from draftsmith.data.cache import tensor_key
from draftsmith.serve.batch.record import Recorded
from draftsmith.serve.core.files import atomic_path

FORMAT = "draftsmith-recorded-states/1"
SUFFIX = ".states.safetensors"


def states_path(part: Path) -> Path:
    """The states file of a part file (`part-NNNNN.jsonl` -> `part-NNNNN.states.safetensors`)."""
    return part.with_name(part.stem + SUFFIX)


@dataclass(frozen=True)
class RecordedOrigin:
    """What recorded states were made with: a capture reads only states of its own layers, dtype and target."""
    layers: tuple[int, ...]
    dtype: str  # the cache's storage dtype name (bf16 | fp16 | fp32)
    target: dict  # config_hash, tokenizer_hash, weights (data/made_for.py TargetRecord)

    def to_json(self) -> dict:
        return {"layers": list(self.layers), "dtype": self.dtype, "target": self.target}


def write_states(path: Path, rows: Sequence[tuple[str, list[int], Recorded]], origin: RecordedOrigin) -> None:
    """Write one part's states under a temporary name and rename it, so a states file that exists is whole. A disk
    that fills gets one line (DiskFullError): the parts written so far stay, and the same command resumes after
    them."""
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    for k, (_, ids, recorded) in enumerate(rows):
        tensors[f"{k}.input_ids"] = torch.tensor(ids, dtype=torch.int32)
        tensors[f"{k}.target_top1"] = recorded.top1.to(torch.int32)
        for layer in origin.layers:
            tensors[f"{k}.{tensor_key(layer)}"] = recorded.states[layer].contiguous()
    metadata = {"draftsmith": json.dumps({"format": FORMAT, "ids": [row[0] for row in rows], **origin.to_json()})}
    with atomic_path(path) as tmp:  # a full disk: one line, the temporary removed (serve/core/files.py)
        save_file(tensors, str(tmp), metadata=metadata)


class RecordedStates:
    """The recorded states of a work folder, by row id; `get` hands out a row's when they are its dataset tokens'."""

    def __init__(self, work: Path, origin: RecordedOrigin):
        self.origin = origin
        self.where: dict[str, tuple[Path, int]] = {}  # row id -> (states file, its index there)
        self.foreign = 0  # parts recorded with other layers, dtype or target
        for path in sorted(work.glob(f"part-*{SUFFIX}")):  # later parts answer a row again: they win
            meta = _metadata(path)
            if meta is None or any(meta.get(k) != v for k, v in origin.to_json().items()):
                self.foreign += 1
                continue
            for k, row_id in enumerate(meta["ids"]):
                self.where[row_id] = (path, k)
        self._open: dict[Path, Any] = {}

    def get(self, row_id: str, input_ids: Sequence[int]) -> Recorded | None:
        """Row `row_id`'s states for these tokens: None when none were recorded or they were read over other
        tokens (the row's recorded tokens must begin with `input_ids`)."""
        if row_id not in self.where:
            return None
        path, k = self.where[row_id]
        handle = self._open.get(path)
        if handle is None:
            from safetensors import safe_open

            handle = self._open[path] = safe_open(str(path), framework="pt")
        ids = handle.get_tensor(f"{k}.input_ids")
        n = len(input_ids)
        if ids.shape[0] < n or not torch.equal(ids[:n], torch.as_tensor(list(input_ids), dtype=torch.int32)):
            return None
        states = {layer: handle.get_slice(f"{k}.{tensor_key(layer)}")[:n] for layer in self.origin.layers}
        return Recorded(states=states, top1=handle.get_slice(f"{k}.target_top1")[:n])


def _metadata(path: Path) -> dict | None:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as handle:
            meta = json.loads((handle.metadata() or {}).get("draftsmith", "{}"))
    except (OSError, ValueError, SafetensorError):  # a truncated or foreign file: its rows are forwarded again
        return None
    return meta if meta.get("format") == FORMAT else None


def remove_states(work: Path) -> int:
    """Delete a work folder's states files once the cache holds them; returns how many."""
    paths = list(work.glob(f"part-*{SUFFIX}"))
    for path in paths:
        path.unlink(missing_ok=True)
    return len(paths)
