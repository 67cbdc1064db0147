"""The hidden-state cache on disk: packed safetensors shards, per-shard sidecars, and a manifest.

Layout of a cache folder:
    manifest.json              identity (target, tokenizer, layers, dtype, dataset), totals, one entry per shard
    shard-NNNNN.safetensors    rows [row_start, row_start + rows) of the dataset, packed:
        input_ids              (N,) int32     the shard's rows concatenated (N tokens in all)
        loss_mask              (N,) uint8
        offsets                (R+1,) int64   row r is tokens offsets[r]:offsets[r+1]
        target_top1            (N,) int32     the target's argmax after each token (absent in older caches)
        hidden_states.<id>     (N, h)         per stored layer id, in the cache dtype
        hidden_states.final    (N, h)         the final normed state (id -1), always stored
        metadata["draftsmith"]: JSON {format, row_start, ids, domains}
    shard-NNNNN.json           sidecar: the shard's entry (rows, tokens, bytes, sha256) and the identity;
                               written after its shard, so a shard with a sidecar is finished (the resume point)

Rows are read back by slicing the memory-mapped shard (`safe_open(...).get_slice`), so a DataLoader
touches only the rows it asks for.
"""
from __future__ import annotations

import bisect
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch

from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.core.files import write_text_atomic
from draftsmith.serve.core.identity import sha256_file
from draftsmith.serve.core.layers import FINAL
from draftsmith.serve.core.target import Target

FORMAT = "draftsmith-hidden-cache/1"
MANIFEST = "manifest.json"
STORAGE_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
_DTYPE_ALIASES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "float": "fp32"}


class CacheError(DraftsmithError):
    """A cache that cannot be used as asked: missing, corrupt, or made for another target or layer set."""


def storage_dtype(name: str) -> tuple[str, torch.dtype]:
    key = _DTYPE_ALIASES.get(str(name).lower(), str(name).lower())
    if key not in STORAGE_DTYPES:
        raise DraftsmithError(f"cache dtype {name!r}: choose one of {', '.join(STORAGE_DTYPES)}")
    return key, STORAGE_DTYPES[key]


def tensor_key(layer_id: int) -> str:
    return "hidden_states.final" if layer_id == FINAL else f"hidden_states.{layer_id}"


def shard_name(index: int) -> str:
    return f"shard-{index:05d}.safetensors"


def sidecar_path(folder: Path, index: int) -> Path:
    return folder / f"shard-{index:05d}.json"


def bytes_per_token(num_stored_layers: int, hidden_size: int, dtype: str) -> int:
    """Cache bytes per token: hidden states plus input_ids (int32) and loss_mask (uint8)."""
    _, torch_dtype = storage_dtype(dtype)
    return num_stored_layers * hidden_size * torch_dtype.itemsize + 4 + 1


@dataclass
class ShardInfo:
    index: int
    file: str
    row_start: int
    rows: int
    tokens: int
    bytes: int
    sha256: str


@dataclass
class PackedShard:
    """A shard in memory: the rows' tokens concatenated, offsets[r]:offsets[r+1] = row r."""
    ids: list[str]
    domains: list[str]
    input_ids: torch.Tensor  # (N,) int32
    loss_mask: torch.Tensor  # (N,) uint8
    offsets: torch.Tensor  # (R+1,) int64
    hidden_states: dict[int, torch.Tensor]  # layer id -> (N, h) in the cache dtype
    target_top1: torch.Tensor | None = None  # (N,) int32

    @classmethod
    def allocate(cls, ids: list[str], domains: list[str], lengths: Sequence[int], layer_ids: Sequence[int],
                 hidden_size: int, dtype: torch.dtype) -> "PackedShard":
        offsets = torch.zeros(len(lengths) + 1, dtype=torch.int64)
        offsets[1:] = torch.tensor(list(lengths), dtype=torch.int64).cumsum(0)
        n = int(offsets[-1])
        return cls(ids=list(ids), domains=list(domains), input_ids=torch.zeros(n, dtype=torch.int32),
                   loss_mask=torch.zeros(n, dtype=torch.uint8), offsets=offsets,
                   hidden_states={i: torch.empty(n, hidden_size, dtype=dtype) for i in layer_ids},
                   target_top1=torch.zeros(n, dtype=torch.int32))

    def put(self, row: int, input_ids: Sequence[int], loss_mask: Sequence[int],
            hidden_states: dict[int, torch.Tensor], *, target_top1: torch.Tensor | None = None) -> None:
        start, end = int(self.offsets[row]), int(self.offsets[row + 1])
        self.input_ids[start:end] = torch.as_tensor(input_ids, dtype=torch.int32)
        self.loss_mask[start:end] = torch.as_tensor(loss_mask, dtype=torch.uint8)
        if target_top1 is not None and self.target_top1 is not None:
            self.target_top1[start:end] = target_top1.to(torch.int32)
        for layer_id, states in hidden_states.items():
            self.hidden_states[layer_id][start:end] = states  # (T, h), cast to the cache dtype on copy


def write_shard(folder: Path, index: int, shard: PackedShard, *, row_start: int) -> ShardInfo:
    """Write a packed shard under a temporary name and rename it, so a shard file that exists is complete."""
    from safetensors.torch import save_file

    tensors = {"input_ids": shard.input_ids, "loss_mask": shard.loss_mask, "offsets": shard.offsets}
    if shard.target_top1 is not None:
        tensors["target_top1"] = shard.target_top1
    tensors.update({tensor_key(i): h for i, h in shard.hidden_states.items()})
    # One metadata key: safetensors writes several in hash order, and equal shards should be equal files.
    metadata = {"draftsmith": json.dumps({"format": FORMAT, "row_start": row_start, "ids": shard.ids,
                                          "domains": shard.domains})}
    path = folder / shard_name(index)
    tmp = folder / f".{path.name}.tmp"
    save_file(tensors, str(tmp), metadata=metadata)
    with open(tmp, "rb+") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return ShardInfo(index=index, file=path.name, row_start=row_start, rows=len(shard.ids),
                     tokens=int(shard.offsets[-1]), bytes=path.stat().st_size, sha256=sha256_file(path))


def write_json_atomic(path: Path, payload: dict) -> None:
    write_text_atomic(path, json.dumps(payload, indent=1))


def check_shard_file(folder: Path, info: ShardInfo | dict, *, verify: bool) -> None:
    """CacheError naming the shard when it is missing, truncated, or (verify) its sha256 differs."""
    entry = info if isinstance(info, dict) else asdict(info)
    path = folder / entry["file"]
    if not path.is_file():
        raise CacheError(f"cache shard {path} is missing")
    size = path.stat().st_size
    if size != entry["bytes"]:
        raise CacheError(f"cache shard {path} is corrupt: {size} bytes, the manifest says {entry['bytes']} "
                         f"(truncated copy?); capture it again")
    if verify and sha256_file(path) != entry["sha256"]:
        raise CacheError(f"cache shard {path} is corrupt: its sha256 does not match the manifest; capture it again")


class CacheReader:
    """Rows of a finished cache as dicts; len() and indexing, so a DataLoader + DistributedSampler can use it.

    row = {"id": str, "domain": str, "input_ids": (T,) long, "loss_mask": (T,) long,
           "hidden_states": {layer_id: (T, h) in the cache dtype}, "target_top1": (T,) long (when captured)}
    verify: check every shard's sha256 now (sizes are always checked).
    layers: read only these stored layer ids (default: all).
    """

    def __init__(self, folder: str | Path, *, verify: bool = True, layers: Sequence[int] | None = None):
        self.folder = Path(folder)
        path = self.folder / MANIFEST
        if not path.is_file():
            raise CacheError(f"no {MANIFEST} in {self.folder}: not a finished hidden-state cache (run "
                             f"`draftsmith data capture` again to finish it)")
        try:
            self.manifest = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise CacheError(f"{path} is not valid JSON ({err.msg}); capture again") from None
        if self.manifest.get("format") != FORMAT:
            raise CacheError(f"{path}: unknown cache format {self.manifest.get('format')!r} (expected {FORMAT})")
        self.shards = [ShardInfo(**s) for s in self.manifest["shards"]]
        for shard in self.shards:
            check_shard_file(self.folder, shard, verify=verify)
        stored = [int(i) for i in self.manifest["layers"]["stored"]]
        if layers is not None:
            missing = [i for i in layers if i not in stored]
            if missing:
                raise CacheError(f"layers {missing} are not in the cache {self.folder} (it holds {stored})")
        self.layer_ids: list[int] = list(layers) if layers is not None else stored
        self._starts = [s.row_start for s in self.shards]
        self._handles: dict[int, tuple[Any, list[str], list[str], torch.Tensor]] = {}

    # --- identity -------------------------------------------------------------------------------------
    @property
    def dtype(self) -> torch.dtype:
        return storage_dtype(self.manifest["dtype"])[1]

    @property
    def hidden_size(self) -> int:
        return int(self.manifest["target"]["hidden_size"])

    @property
    def aux_layer_ids(self) -> list[int]:
        return [int(i) for i in self.manifest["layers"]["aux_layer_ids"]]

    @property
    def num_tokens(self) -> int:
        return int(self.manifest["tokens"])

    def check_target(self, target: Target) -> None:
        """DraftsmithError when the cache was captured from another model or tokenizer than `target`."""
        mine = self.manifest["target"]
        problems = []
        if mine["config_hash"] != target.config_hash:
            problems.append(f"model config hash {mine['config_hash']} != {target.config_hash}")
        if mine["tokenizer_hash"] != target.tokenizer_hash:
            problems.append(f"tokenizer hash {mine['tokenizer_hash']} != {target.tokenizer_hash}")
        if problems:
            raise CacheError(f"the cache {self.folder} was captured from {mine['name']!r}, not from target "
                             f"{target.name!r} ({'; '.join(problems)}); capture it again for this target")

    # --- rows -----------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return int(self.manifest["rows"])

    def row_lengths(self) -> list[int]:
        """Tokens per row, in row order (for length-grouped sampling)."""
        lengths: list[int] = []
        for shard in range(len(self.shards)):
            offsets = self._open(shard)[3]
            lengths += (offsets[1:] - offsets[:-1]).tolist()
        return lengths

    def _open(self, shard: int):
        if shard not in self._handles:
            from safetensors import safe_open

            handle = safe_open(str(self.folder / self.shards[shard].file), framework="pt")
            meta = json.loads((handle.metadata() or {})["draftsmith"])
            self._handles[shard] = (handle, meta["ids"], meta["domains"], handle.get_tensor("offsets"))
        return self._handles[shard]

    def __getitem__(self, index: int) -> dict:
        n = len(self)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(f"row {index} out of range for a cache of {n} rows")
        shard = bisect.bisect_right(self._starts, index) - 1
        handle, ids, domains, offsets = self._open(shard)
        local = index - self.shards[shard].row_start
        start, end = int(offsets[local]), int(offsets[local + 1])
        row = {"id": ids[local], "domain": domains[local],
               "input_ids": handle.get_slice("input_ids")[start:end].long(),  # (T,)
               "loss_mask": handle.get_slice("loss_mask")[start:end].long(),  # (T,)
               "hidden_states": {i: handle.get_slice(tensor_key(i))[start:end] for i in self.layer_ids}}
        if "target_top1" in handle.keys():
            row["target_top1"] = handle.get_slice("target_top1")[start:end].long()  # (T,)
        return row

    def __iter__(self) -> Iterator[dict]:
        for index in range(len(self)):
            yield self[index]

    def __getstate__(self) -> dict:  # DataLoader workers re-open the shards themselves
        state = dict(self.__dict__)
        state["_handles"] = {}
        return state
