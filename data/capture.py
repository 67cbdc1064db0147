"""Hidden-state capture for offline training: the target's states at a drafter's layers, sharded on disk.

Shard s holds dataset rows [s * rows_per_shard, (s + 1) * rows_per_shard); under `accelerate launch` or
`torchrun` rank r captures the shards s with s % world == r, and rank 0 merges their sidecars into the
manifest. Because a shard's content does not depend on who wrote it, a capture resumed after a kill (with
any number of processes) keeps every finished shard (checked against its sha256) and redoes the rest.
Format: data/cache.py. `data build --capture` writes the same cache from the states its generating forwards kept
(data/recorded.py: `recorded`), forwarding only the rows it has none for.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import time
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from draftsmith.data.cache import (FORMAT, MANIFEST, CacheError, CacheReader, PackedShard, ShardInfo, bytes_per_token,
                        check_shard_file, shard_name, sidecar_path, storage_dtype, write_json_atomic,
                        write_shard)
from draftsmith.data.config import CaptureConfig, validate
from draftsmith.data.layers import CONVENTION, LayerSpec, resolve_layers
from draftsmith.data.made_for import TargetRecord, check_made_for, dataset_record, describe, probe_target
from draftsmith.data.recorded import RecordedStates
from draftsmith.serve.batch.prefill import plan_batches
from draftsmith.serve.batch.record import target_argmax
from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.core.invariant import suspended
from draftsmith.serve.core.layers import FINAL, pick_hidden_states
from draftsmith.serve.core.target import Target

__all__ = ["CacheReader", "CaptureResult", "capture_hidden_states", "check_cache_current", "check_disk",
           "dataset_digest",
           "forward_hidden_states", "plan_batches", "right_pad"]

GIB = 1 << 30
PLANNED_ROW_TOKENS = 2048  # a row's length in a memory plan without capture.max_length: data build's default cap


@dataclass
class CaptureResult:
    out_dir: Path
    rows: int
    tokens: int
    bytes: int
    shards_written: int  # by this process
    shards_reused: int  # by this process
    tokens_captured: int  # by this process
    seconds: float  # this process's capture time (forwards + writes)
    tokens_recorded: int = 0  # of tokens_captured, taken from states recorded while generating (not forwarded)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens_captured / self.seconds if self.seconds else 0.0


def dataset_digest(dataset: Any) -> str:
    """sha256 (16 hex) of the rows' ids, input_ids and loss masks: the cache's dataset identity."""
    digest = hashlib.sha256()
    for block in dataset.select_columns(["id", "input_ids", "loss_mask"]).iter(batch_size=1024):
        for row_id, ids, mask in zip(block["id"], block["input_ids"], block["loss_mask"]):
            digest.update(row_id.encode() + b"\0")
            digest.update(np.asarray(ids, dtype=np.int64).tobytes())
            digest.update(np.asarray(mask, dtype=np.int8).tobytes())
    return digest.hexdigest()[:16]


def check_cache_current(reader: CacheReader, *, target_spec: str) -> None:
    """CacheError when the dataset a cache was captured from has changed since (a `data build` added rows, or
    rebuilt them): its digest now differs from the one the manifest records. A dataset no longer at the recorded
    path (moved, or a cache copied to another machine) cannot be compared and is taken as it was."""
    import datasets

    recorded = reader.manifest.get("dataset") or {}
    path, digest = recorded.get("path"), recorded.get("digest")
    if not path or not digest or not (Path(path) / "dataset_info.json").is_file():
        return
    dataset = datasets.load_from_disk(path)
    current = dataset_digest(dataset)
    if current != digest:
        layers, dtype = reader.manifest["layers"]["spec"], reader.manifest["dtype"]
        raise CacheError(f"the cache {reader.folder} is stale: it was captured from {path} with dataset digest "
                         f"{digest} ({recorded.get('rows')} rows), and that dataset's digest is now {current} "
                         f"({len(dataset)} rows). Refresh the cache: draftsmith data capture --target {target_spec} "
                         f"--dataset {path} --out {reader.folder}.new --layers {layers} --storage-dtype {dtype}, then "
                         f"train with data.cache={reader.folder}.new (or delete {reader.folder} and capture into it)")


def right_pad(sequences: list[list[int]], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask), both (B, T_max), sequences left-aligned (causal attention never sees the pad)."""
    width = max(len(s) for s in sequences)
    input_ids = torch.full((len(sequences), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for b, seq in enumerate(sequences):
        input_ids[b, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        attention_mask[b, : len(seq)] = 1
    return input_ids, attention_mask


@torch.inference_mode()
def forward_hidden_states(target: Target, sequences: list[list[int]], layer_ids: tuple[int, ...]) -> list[dict[int, torch.Tensor]]:
    """One right-padded forward of the target's decoder (no lm_head); per sequence {layer id: (T, h)}."""
    decoder = target.model.get_decoder()
    device = next(decoder.parameters()).device
    input_ids, attention_mask = right_pad(sequences, target.tokenizer.pad_token_id or 0)
    with suspended(target.model):  # training features decide no token: the ordinary kernels (serve/core/invariant.py)
        out = decoder(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device),
                      output_hidden_states=True, use_cache=False)
    picked = pick_hidden_states(out.hidden_states, layer_ids)  # {id: (B, T, h)}
    return [{i: h[b, : len(seq)] for i, h in picked.items()} for b, seq in enumerate(sequences)]


def forward_sharded(target: Target, sequences: list[list[int]],
                    layer_ids: tuple[int, ...]) -> list[tuple[dict[int, torch.Tensor], torch.Tensor]]:
    """forward_hidden_states of a target split over the launch (one lock-step forward, serve/core/sharded_target.py),
    with the target's argmax: per sequence ({layer id: (T, h)}, (T,))."""
    input_ids, attention_mask = right_pad(sequences, target.tokenizer.pad_token_id or 0)
    picked, top1 = target.sharded.forward(input_ids, attention_mask, layer_ids)  # {id: (B, T, h)}, (B, T)
    return [({i: h[b, : len(seq)] for i, h in picked.items()}, top1[b, : len(seq)]) for b, seq in enumerate(sequences)]


def capture_workload(config: CaptureConfig, hf_config: Any):
    """What a capture asks of each device (serve/core/memory_plan.py), from the target's config alone."""
    from draftsmith.serve.core.memory_plan import Workload
    from draftsmith.serve.core.target import text_config

    text = text_config(hf_config)
    layers = resolve_layers(config.layers, text.num_hidden_layers)
    context = getattr(text, "max_position_embeddings", None) or 1 << 30
    max_length = min(config.max_length or PLANNED_ROW_TOKENS, context)  # rows are as long as `data build` made them
    compute = "float32" if config.target_dtype == "auto" else config.target_dtype
    return Workload(task="capture", dtype=compute, tokens=config.batch_tokens, stored_layers=len(layers.stored),
                    cache_dtype=storage_dtype(config.dtype)[0], shard_tokens=config.rows_per_shard * max_length,
                    split_over_tp=True)


def _identity(record: TargetRecord, layers: LayerSpec, dtype: str, digest: str, config: CaptureConfig,
              max_length: int) -> dict:
    return {"target_config_hash": record.config_hash, "tokenizer_hash": record.tokenizer_hash,
            "target_weights": record.weights, "layers": list(layers.stored), "dtype": dtype,
            "dataset_digest": digest, "rows_per_shard": config.rows_per_shard, "max_length": max_length}


_LATER_KEYS = ("target_weights",)  # absent from the captures of earlier versions: not compared there


def check_existing(out: Path, identity: dict, run: TargetRecord) -> None:
    """Refuse to add shards to a folder holding another capture (other target, layers, dtype or data); another
    target is named, whatever --allow-other-target says: one cache never mixes two targets' states."""
    found = []
    manifest = out / MANIFEST
    if manifest.is_file():
        found.append((manifest, json.loads(manifest.read_text())))
    for sidecar in sorted(out.glob("shard-*.json")):
        found.append((sidecar, json.loads(sidecar.read_text())))
    for path, payload in found:
        other = payload.get("identity", {})
        made = TargetRecord.from_json({"name": "another target", **payload.get("target", {}),
                                       "config_hash": other.get("target_config_hash"),
                                       "tokenizer_hash": other.get("tokenizer_hash"),
                                       "weights": other.get("target_weights")})
        line = describe(made, run, f"{out} holds a capture (see {path.name}) made")
        if line:
            raise CacheError(f"{line}; one cache cannot mix two targets' hidden states: capture into another --out, "
                             f"or delete {out} first")
        changed = [k for k in identity if other.get(k) != identity[k] and not (k in _LATER_KEYS and k not in other)]
        if changed:
            raise CacheError(f"{out} already holds a capture that differs in {', '.join(changed)} "
                             f"(see {path.name}); refusing to mix shards: use another --out or delete {out}")


def _finished(out: Path, index: int) -> ShardInfo | None:
    """The shard's entry when its file and sidecar agree (size and sha256); None when it must be redone."""
    sidecar = sidecar_path(out, index)
    if not sidecar.is_file():
        return None
    try:
        info = ShardInfo(**json.loads(sidecar.read_text())["shard"])
        check_shard_file(out, info, verify=True)
    except (CacheError, json.JSONDecodeError, KeyError, TypeError):
        return None
    return info


def _row_lengths(dataset: Any, max_length: int) -> list[int]:
    lengths = []
    for block in dataset.select_columns(["input_ids"]).iter(batch_size=1024):
        lengths += [min(len(ids), max_length) for ids in block["input_ids"]]
    return lengths


def check_disk(out: Path, needed: int, headroom: int) -> tuple[int, int]:
    """(needed, free) bytes; DraftsmithError before any work when the cache would not fit."""
    probe = out
    while not probe.exists():
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if needed + headroom > free:
        raise DraftsmithError(f"the cache needs ~{needed / GIB:.2f} GiB (+{headroom / GIB:.2f} GiB headroom) but "
                              f"{probe} has {free / GIB:.2f} GiB free: free space, use another --out, or capture "
                              f"fewer layers / a 16-bit dtype")
    return needed, free


def capture_hidden_states(target: Target | str | Path, dataset_dir: str | Path, out_dir: str | Path, config: CaptureConfig, *,
                          progress: bool = True, log: Callable[[str], None] = print,
                          on_shard: Callable[[int], None] | None = None,
                          recorded: RecordedStates | None = None) -> CaptureResult:
    """Capture `config.layers` of `target` over the dataset written by `data build` into `out_dir`.

    target: a draftsmith.serve.core.target.Target or a spec for load_target. on_shard(index) runs after each shard is
    written (tests use it to interrupt a capture). recorded: states kept while the dataset was generated
    (data/recorded.py), taken for the rows whose tokens they were read over; the other rows are forwarded.
    """
    import datasets

    from draftsmith.data import dist as dist_mod
    from draftsmith.serve.core.launch_target import check_launch_inputs, load_launch_target
    from draftsmith.serve.core.process_group import start as start_process_group
    from draftsmith.serve.core.target import text_config

    validate(config)
    on_cpu = config.device == "cpu" or (config.device == "auto" and not torch.cuda.is_available())
    spec = str(target) if isinstance(target, (str, Path)) else target.name
    start_process_group(device_type="cpu" if on_cpu else "cuda", command=f"data capture --target {spec} ...")
    dist = dist_mod.current(cpu=True if config.device == "cpu" else None)
    dtype_name, torch_dtype = storage_dtype(config.dtype)
    dataset_path = Path(dataset_dir)
    if not (dataset_path / "dataset_info.json").is_file():
        raise DraftsmithError(f"{dataset_path} is not a dataset written by `draftsmith data build` "
                              f"(no dataset_info.json)")
    dataset = datasets.load_from_disk(str(dataset_path))
    missing = {"id", "domain", "input_ids", "loss_mask"} - set(dataset.column_names)
    if missing:
        raise DraftsmithError(f"{dataset_path} lacks columns {sorted(missing)}: build it with `draftsmith data build`")
    digest = dataset_digest(dataset)
    # what the dataset and the out folder were made for is checked on the target's config and tokenizer, before
    # any weight is read
    probe = probe_target(str(target)) if isinstance(target, (str, Path)) else target
    run = TargetRecord.of(probe)
    note = _check_built_for(dataset_path, run, allow_other=config.allow_other_target)
    if note and dist.is_main:
        log(note)
    text = text_config(probe.config)
    layers = resolve_layers(config.layers, probe.num_layers)
    context = getattr(text, "max_position_embeddings", None) or 1 << 30
    max_length = min(config.max_length or context, context)
    out = Path(out_dir)
    identity = _identity(run, layers, dtype_name, digest, config, max_length)
    check_existing(out, identity, run)
    if isinstance(target, (str, Path)):
        check_launch_inputs(recipe=asdict(config), spec=str(target), extra={"dataset": digest})
        device = str(dist.device) if config.device == "auto" else config.device
        target = load_launch_target(replace(config.target, spec=str(target)), dtype=config.target_dtype,
                                    device=device, workload=partial(capture_workload, config), top1=True, log=log)
    if dist.world > 1 and next(target.model.parameters()).device.type == "cpu":
        torch.set_num_threads(max(1, torch.get_num_threads() // dist.world))  # ranks share the cores

    rows = len(dataset)
    lengths = _row_lengths(dataset, max_length)
    shards = [(s, start, min(start + config.rows_per_shard, rows))
              for s, start in enumerate(range(0, rows, config.rows_per_shard))]
    mine = [sh for sh in shards if sh[0] % dist.world == dist.rank]
    done = {s: info for s, _, _ in mine if (info := _finished(out, s)) is not None}
    per_token = bytes_per_token(len(layers.stored), text.hidden_size, dtype_name)
    needed = sum(sum(lengths[a:b]) for s, a, b in shards if not (out / shard_name(s)).is_file()) * per_token
    total = sum(lengths) * per_token
    if dist.is_main:
        log(f"data capture: {rows} rows, {sum(lengths)} tokens, layers {list(layers.stored)} ({layers.spec}; "
            f"{CONVENTION}), {dtype_name}, {per_token} bytes/token -> ~{total / GIB:.3f} GiB in {len(shards)} shards, "
            f"~{needed / GIB:.3f} GiB still to write, {dist.world} process(es)")
    out.mkdir(parents=True, exist_ok=True)
    check_disk(out, needed, int(config.disk_headroom_gib * GIB))
    dist.barrier()  # every rank has read what the folder held before any rank changes it

    written, captured, seconds, from_records = 0, 0, 0.0, 0
    todo = [sh for sh in mine if sh[0] not in done]
    if todo:  # a manifest left by an earlier run no longer describes the folder until the merge below
        (out / MANIFEST).unlink(missing_ok=True)
    from tqdm.auto import tqdm

    bar = tqdm(total=sum(sum(lengths[a:b]) for _, a, b in todo), unit="tok", desc=f"capture[{dist.rank}]",
               disable=not progress or not dist.is_main, dynamic_ncols=True)
    for index, start, end in todo:
        t0 = time.perf_counter()
        block = dataset.select(range(start, end))
        packed, taken = _capture_shard(target, block, layers.stored, max_length, config.batch_tokens, torch_dtype,
                                       recorded)
        from_records += taken
        info = write_shard(out, index, packed, row_start=start)
        del packed
        write_json_atomic(sidecar_path(out, index), {"shard": asdict(info), "identity": identity,
                                                     "target": run.to_json(), "written_by_rank": dist.rank,
                                                     "world": dist.world})
        seconds += time.perf_counter() - t0
        captured += info.tokens
        written += 1
        bar.update(info.tokens)
        bar.set_postfix(tok_s=f"{captured / max(seconds, 1e-9):.0f}")
        if on_shard is not None:
            on_shard(index)
    bar.close()
    if getattr(target, "sharded", None) is not None:
        target.sharded.drain()  # the processes still capturing forward in lock-step with this one
    dist.barrier()
    if dist.is_main:
        manifest = _merge_manifest(out, shards, target, layers, dtype_name, identity, config, dataset_path,
                                   lengths, dataset)
        log(f"data capture: {manifest['rows']} rows, {manifest['tokens']} tokens, "
            f"{manifest['bytes'] / GIB:.3f} GiB in {len(shards)} shards -> {out}")
    dist.barrier()
    manifest = json.loads((out / MANIFEST).read_text())
    return CaptureResult(out_dir=out, rows=manifest["rows"], tokens=manifest["tokens"], bytes=manifest["bytes"],
                         shards_written=written, shards_reused=len(done), tokens_captured=captured, seconds=seconds,
                         tokens_recorded=from_records)


def _check_built_for(dataset_path: Path, run: TargetRecord, *, allow_other: bool) -> str | None:
    """DraftsmithError when the dataset was built for another target (data/made_for.py); a note when
    allow_other lets a fine-tune of it through."""
    made = dataset_record(dataset_path)
    if made is None:
        return None  # a dataset made elsewhere: its token ids are trusted to be this target's
    return check_made_for(made, run, what=f"{dataset_path} was built", allow_other=allow_other,
                          remake=f"rebuild it with `draftsmith data build --target {run.name} --out NEW_FOLDER ...`")


def _capture_shard(target: Target, block: Any, layer_ids: tuple[int, ...], max_length: int, batch_tokens: int,
                   dtype: torch.dtype, recorded: RecordedStates | None = None) -> tuple[PackedShard, int]:
    """The shard's rows: their recorded states where they have them, the others forwarded in token-budgeted
    batches, each row's states copied straight into the preallocated shard (memory: one shard in the cache dtype
    plus one batch's activations). Returns the shard and how many of its tokens came from `recorded`."""
    from draftsmith.serve.core.target import text_config

    ids = [list(x)[:max_length] for x in block["input_ids"]]
    masks = [list(x)[:max_length] for x in block["loss_mask"]]
    shard = PackedShard.allocate(block["id"], block["domain"], [len(x) for x in ids], layer_ids,
                                 text_config(target.config).hidden_size, dtype)
    todo, taken = [], 0
    for i, row_id in enumerate(block["id"]):
        got = recorded.get(row_id, ids[i]) if recorded is not None else None
        if got is None:
            todo.append(i)
        else:
            shard.put(i, ids[i], masks[i], got.states, target_top1=got.top1)
            taken += len(ids[i])
    if getattr(target, "sharded", None) is not None:
        # a TP group forwards its processes' batches together: each plans 1/tp of the budget
        budget = max(batch_tokens // target.sharded.layout.tp, 1)
        for batch in plan_batches([len(ids[i]) for i in todo], budget):
            rows = [todo[j] for j in batch]
            for i, (hidden, top1) in zip(rows, forward_sharded(target, [ids[i] for i in rows], layer_ids)):
                shard.put(i, ids[i], masks[i], hidden, target_top1=top1)
        return shard, taken
    head = target.model.get_output_embeddings()
    for batch in plan_batches([len(ids[i]) for i in todo], batch_tokens):
        rows = [todo[j] for j in batch]
        for i, hidden in zip(rows, forward_hidden_states(target, [ids[i] for i in rows], layer_ids)):
            shard.put(i, ids[i], masks[i], hidden, target_top1=target_argmax(head, hidden[FINAL]))
    return shard, taken


def _merge_manifest(out: Path, shards: list[tuple[int, int, int]], target: Target, layers: LayerSpec, dtype: str,
                    identity: dict, config: CaptureConfig, dataset_path: Path, lengths: list[int],
                    dataset: Any) -> dict:
    entries = []
    for index, _, _ in shards:
        sidecar = sidecar_path(out, index)
        if not sidecar.is_file():
            raise CacheError(f"shard {index} of {out} was not written (a process failed?); run the capture again")
        entries.append(json.loads(sidecar.read_text())["shard"])
    from draftsmith.serve.core.target import text_config

    text = text_config(target.config)
    truncated = sum(len(x) > identity["max_length"] for x in dataset.select_columns(["input_ids"])["input_ids"])
    manifest = {
        "format": FORMAT,
        "target": {"name": target.name, "config_hash": target.config_hash, "tokenizer_hash": target.tokenizer_hash,
                   "weights": identity["target_weights"], "num_layers": target.num_layers,
                   "hidden_size": text.hidden_size, "vocab_size": text.vocab_size},
        "layers": {"spec": layers.spec, "aux_layer_ids": list(layers.aux_layer_ids), "stored": list(layers.stored),
                   "final": FINAL, "convention": CONVENTION},
        "dtype": dtype,
        "layout": "packed per shard: input_ids (N,) int32, loss_mask (N,) uint8, offsets (R+1,) int64, "
                  "target_top1 (N,) int32, hidden_states.<id> / hidden_states.final (N, h); ids and domains in the "
                  "safetensors metadata",
        "dataset": {"path": str(dataset_path.resolve()), "digest": identity["dataset_digest"], "rows": len(lengths)},
        "rows": sum(e["rows"] for e in entries),
        "tokens": sum(e["tokens"] for e in entries),
        "bytes": sum(e["bytes"] for e in entries),
        "truncated_rows": int(truncated),
        "identity": identity,
        "capture": asdict(config),
        "shards": entries,
    }
    write_json_atomic(out / MANIFEST, manifest)
    return manifest

