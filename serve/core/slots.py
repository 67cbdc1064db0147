"""A KV cache of fixed rows ("slots") that each hold one sequence, left-aligned, for batched decoding.

Row r holds its sequence at columns [0, length_r). A forward writes each row's new tokens at that row's own
columns and attends over the columns up to the longest row, under a per-row mask, so rows of different lengths
and different accepted counts never shift one another: positions are passed explicitly and a row's stale
columns (rejected drafts, another request's leftovers) are masked, then overwritten. The buffers are filled
through the `update` call every attention layer makes (transformers' Cache API): `plan_prefill` /
`plan_write` say what the next forward writes.

Used by the batched decoder (serve/batch/decoder.py: a pending token and its drafts per row; a drafter attending to
the target's keys and values reads its row through `row`), which also runs self-distillation (data/generate.py, one
new token per row). A hybrid target's recurrent layers keep their states per row beside the buffers
(serve/core/recurrent_slots.py).
"""
from __future__ import annotations

import math
import mmap
from typing import Any, NamedTuple, Sequence

import torch

from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.core.recurrent_slots import RecurrentSlots
from draftsmith.serve.core.target_config import text_config


# what a hybrid target's recurrent layers call on their cache (transformers' linear-attention API)
_RECURRENT_CALLS = frozenset({"get_conv_state", "update_conv_state", "get_recurrent_state", "update_recurrent_state",
                              "get_recurrent_states_to_keep", "is_recording_past", "increase_count"})


def kv_bytes_per_token(config: Any, dtype: torch.dtype) -> int:
    """Bytes of keys and values one token takes in a full cache of every layer (an upper bound for a hybrid target,
    whose recurrent layers hold none)."""
    config = text_config(config)
    layers = [config]
    try:
        config.head_dim
    except Exception:  # noqa: BLE001  a heterogeneous config (Gemma 4): per-layer sizes only
        layers = list(config.per_layer_config)
    width = 0
    for layer in layers:
        heads = layer.num_attention_heads
        kv_heads = getattr(layer, "num_key_value_heads", None) or heads
        head_dim = getattr(layer, "head_dim", None) or layer.hidden_size // heads
        if getattr(layer, "kv_lora_rank", None):  # DeepSeek's latent attention caches one latent and one RoPE key
            # (and V3.2's lightning indexer one key of its own)
            width = max(width, layer.kv_lora_rank + layer.qk_rope_head_dim + (getattr(layer, "index_head_dim", 0) or 0))
            continue
        if getattr(layer, "model_type", None) == "mimo_v2_flash":
            kv_heads *= 2  # its sliding layers hold twice the key/value heads (transformers' MiMoV2FlashAttention)
        width = max(width, kv_heads * (head_dim + (getattr(layer, "v_head_dim", None) or head_dim)))
    return config.num_hidden_layers * width * torch.finfo(dtype).bits // 8


def available_bytes(device: torch.device) -> int | None:
    """Memory free for new buffers on `device` now (None: unknown)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as f:
            info = dict(line.split(":", 1) for line in f)
        return int(info["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None


def check_fits(config: Any, dtype: torch.dtype, device: torch.device, *, slots: int, capacity: int,
               headroom: float = 0.8) -> None:
    """Refuse, before any work, a cache of `slots` rows x `capacity` tokens that the device's free memory cannot
    hold (with `headroom` of it left for activations and logits)."""
    need = kv_bytes_per_token(config, dtype) * slots * capacity
    free = available_bytes(device)
    if free is None or need <= headroom * free:
        return
    fit = int(headroom * free // max(1, kv_bytes_per_token(config, dtype) * capacity))
    raise DraftsmithError(f"a batch of {slots} rows x {capacity} tokens needs {need / 2**30:.1f} GiB of KV cache on "
                          f"{device}, but only {free / 2**30:.1f} GiB is free: use a batch of at most {fit} rows, or "
                          f"fewer new tokens per request")


def reserve_zeros(shape: Sequence[int], like: torch.Tensor) -> torch.Tensor:
    """A zero tensor of `like`'s dtype and device. On the CPU it lies in a private anonymous mapping, whose pages
    the kernel zero-fills when first written: a cache reserved for a request's whole `max_tokens` costs memory only
    for the tokens it holds (zero-filling 3 GB up front took 1.5 s on a 2-core machine), and freeing it unmaps it."""
    nbytes = math.prod(shape) * like.element_size()
    if like.device.type != "cpu" or nbytes == 0 or not hasattr(mmap, "MAP_PRIVATE"):
        return like.new_zeros(shape)
    pages = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE)  # -1: anonymous; private: not shared after a fork
    return torch.frombuffer(pages, dtype=like.dtype).view(*shape)  # the tensor keeps the mapping alive


class SlotCache:
    """The KV buffers: (slots, kv_heads, capacity, head_dim) per layer (values' head_dim may differ: MLA, MiMo),
    allocated on first use (reserved: on the CPU only the columns written take memory). `recurrent`: the target also
    has layers with a recurrent state (a hybrid target), kept per row by serve/core/recurrent_slots.py; its newcomers
    are prefilled one at a time."""

    def __init__(self, slots: int, capacity: int, *, recurrent: bool = False):
        self.slots = slots
        self.capacity = capacity
        self.keys: dict[int, torch.Tensor] = {}  # layer -> (slots, kv_heads, capacity, head_dim)
        self.values: dict[int, torch.Tensor] = {}
        # layer -> (slots, 1, capacity, index_head_dim): DeepSeek-V3.2's lightning-indexer keys, kept as keys are
        self.indexer_keys: dict[int, torch.Tensor] = {}
        self.recurrent = RecurrentSlots(slots) if recurrent else None
        self._plan: tuple = ()

    def plan_prefill(self, rows: Sequence[int], lengths: Sequence[int]) -> None:
        """Next forward: newcomers left-padded to max(lengths); newcomer n goes to row rows[n], columns [0, len)."""
        rows = list(rows)
        if self.recurrent is not None:
            if len(rows) != 1:
                raise ValueError("a hybrid target's newcomers are prefilled one at a time (no padding in its state)")
            self.recurrent.plan_prefill(rows[0])
        self._plan = ("prefill", rows, list(lengths))

    def plan_write(self, active: int, columns: torch.Tensor, window: int) -> None:
        """Next forward: W tokens for each of rows [0, active), row r's j-th written at columns[r] + j
        (columns: (active,) long); every row attends to columns [0, window)."""
        if self.recurrent is not None:
            self.recurrent.plan_cycle(active)
        self._plan = ("write", active, columns, window)

    def __getattr__(self, name: str):
        """The linear-attention calls of a hybrid target's recurrent layers (RecurrentSlots)."""
        if name in _RECURRENT_CALLS and self.__dict__.get("recurrent") is not None:
            return getattr(self.__dict__["recurrent"], name)
        raise AttributeError(name)

    def grow(self, capacity: int) -> None:
        if capacity <= self.capacity:
            return
        for store in self.stores():
            for layer, old in store.items():
                new = reserve_zeros((old.shape[0], old.shape[1], capacity, old.shape[3]), old)
                new[:, :, : self.capacity] = old
                store[layer] = new
        self.capacity = capacity

    def move_row(self, src: int, dst: int, length: int) -> None:
        for store in self.stores():
            for buffer in store.values():
                buffer[dst, :, :length] = buffer[src, :, :length]
        if self.recurrent is not None:
            self.recurrent.move_row(src, dst)

    def keep(self, row: int, start: int, offsets: Sequence[int]) -> None:
        """After a write at columns start.. of `row`, keep the written offsets (ascending) at start, start+1, ...
        (a tree's accepted path); a prefix needs no copy (the rest is masked, then overwritten). Recurrent layers
        keep their states after the prefix (a hybrid target's drafts are chains)."""
        if self.recurrent is not None:
            self.recurrent.keep(row, len(offsets))
        if list(offsets) == list(range(len(offsets))):
            return
        src = torch.tensor([start + o for o in offsets])
        for store in self.stores():
            for buffer in store.values():
                index = src.to(buffer.device)
                buffer[row, :, start: start + len(offsets)] = buffer[row].index_select(1, index)

    def stores(self) -> tuple[dict[int, torch.Tensor], ...]:
        """Every per-layer buffer of (slots, heads, capacity, dim): keys, values, indexer keys."""
        return self.keys, self.values, self.indexer_keys

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        return self._write(self.keys, layer_idx, key_states), self._write(self.values, layer_idx, value_states)

    def update_indexer(self, indexer_key_states: torch.Tensor, layer_idx: int) -> torch.Tensor:
        """DeepSeek-V3.2's lightning indexer: its keys (N, W, index_head_dim) written as keys are -> the keys it
        scores (N, columns, index_head_dim)."""
        return self._write(self.indexer_keys, layer_idx, indexer_key_states[:, None])[:, 0]

    def _write(self, store: dict[int, torch.Tensor], layer_idx: int, states: torch.Tensor) -> torch.Tensor:
        """states (N, heads, W, dim) written where the plan says -> what the layer attends over. Each store has its own
        width (values narrower than keys: MiMo; DeepSeek's latent and RoPE key)."""
        if layer_idx not in store:
            store[layer_idx] = reserve_zeros((self.slots, states.shape[1], self.capacity, states.shape[3]), states)
        buffer = store[layer_idx]
        width = states.shape[2]
        if self._plan[0] == "prefill":
            _, rows, lengths = self._plan
            for n, (row, length) in enumerate(zip(rows, lengths)):
                buffer[row, :, :length] = states[n, :, width - length:]
            return states  # the prefill attends within its own (padded) batch
        _, active, columns, window = self._plan
        rows = torch.arange(active, device=columns.device)[:, None]  # (A, 1)
        where = columns[:, None] + torch.arange(width, device=columns.device)[None, :]  # (A, W)
        buffer[rows, :, where] = states.transpose(1, 2)  # indexed: (A, W, heads, dim)
        return buffer[:active, :, :window]  # (A, heads, window, dim)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0  # positions are always passed explicitly

    def row(self, row: int, length: int) -> "SlotRow":
        """Row `row`'s first `length` columns, as a drafter that attends to the target's keys and values reads a
        cache (Drafter.watch_cache)."""
        return SlotRow(self, row, length)


class SlotRow:
    """One row of a SlotCache read as transformers' DynamicCache is: `layers[i].keys` / `.values` are layer i's keys
    and values of the row's first `length` columns, (1, kv_heads, length, head_dim) views of the buffers taken when
    read (rows move and buffers grow between cycles: the decoder hands a new view each cycle). A sliding layer's
    columns are all there, not only its window's."""

    def __init__(self, cache: SlotCache, row: int, length: int):
        self.layers = _RowLayers(cache, row, length)


class RowLayer(NamedTuple):
    keys: torch.Tensor
    values: torch.Tensor


class _RowLayers:
    def __init__(self, cache: SlotCache, row: int, length: int):
        self.cache, self.row, self.length = cache, row, length

    def __getitem__(self, layer: int) -> RowLayer:
        if layer not in self.cache.keys:
            raise KeyError(f"layer {layer} holds no keys in the slot cache (it reads another layer's, or none)")
        rows, columns = slice(self.row, self.row + 1), slice(0, self.length)
        return RowLayer(self.cache.keys[layer][rows, :, columns], self.cache.values[layer][rows, :, columns])
