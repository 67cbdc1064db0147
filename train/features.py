"""Where a training batch's target features come from.

online:  rows of a `data build` dataset (input_ids, loss_mask); the frozen target computes the hidden states
         inside the step, without autograd.
offline: rows of a `data capture` cache, hidden states included (data.capture.CacheReader).
Both yield the same FeatureBatch, so a head trains identically on either.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch

from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.core.invariant import suspended
from draftsmith.serve.core.layers import pick_hidden_states
from draftsmith.serve.methods.objective import FeatureBatch
from draftsmith.serve.core.target import Target

REQUIRED_COLUMNS = ("input_ids", "loss_mask")


class DatasetRows:
    """Row access to a `draftsmith data build` dataset (HF datasets, save_to_disk), or to the traffic a
    `draftsmith serve --record` folder holds (its answers as served; `tokenizer_hash` must be the recording's)."""

    def __init__(self, path: str | Path, *, tokenizer_hash: str | None = None):
        from datasets import Dataset, load_from_disk

        from draftsmith.serve.core.traffic import is_traffic_folder, traffic_rows

        if not Path(path).exists():
            raise DraftsmithError(f"training dataset not found: {path} (make one with `draftsmith data build`)")
        if is_traffic_folder(path):
            self.dataset = Dataset.from_dict(traffic_rows(path, tokenizer_hash=tokenizer_hash))
        else:
            self.dataset = load_from_disk(str(path))
        missing = [c for c in REQUIRED_COLUMNS if c not in self.dataset.column_names]
        if missing:
            raise DraftsmithError(f"dataset {path} lacks columns {missing}; it has {self.dataset.column_names}")

    def __len__(self) -> int:
        return len(self.dataset)

    def row_lengths(self) -> list[int]:
        """Tokens per row, in row order."""
        return [len(ids) for ids in self.dataset["input_ids"]]

    def __getitem__(self, i: int) -> dict:
        row = self.dataset[int(i)]
        return {"input_ids": row["input_ids"], "loss_mask": row["loss_mask"], "domain": row.get("domain")}


def open_rows(mode: str, *, dataset: str = "", cache: str = "", target: Target | None=None, layers: Sequence[int] = (),
              target_spec: str = "", allow_other_target: bool = False):
    """online: the rows of a `data build` dataset; offline: a capture cache, refused when it was captured from
    another target (unless allow_other_target: train/preflight.py has then checked the tokenizer and hidden size)
    or its dataset has changed since (target_spec: how its refresh command names the target)."""
    if mode == "online":
        return DatasetRows(dataset, tokenizer_hash=target.tokenizer_hash if target is not None else None)
    from draftsmith.data.capture import CacheReader, check_cache_current

    reader = CacheReader(cache, layers=list(layers))  # CacheError names layers the cache lacks
    if target is not None and not allow_other_target:
        reader.check_target(target)
    check_cache_current(reader, target_spec=target_spec or getattr(target, "name", None) or "TARGET")
    return reader


def split_rows(n: int, *, eval_rows: int, seed: int, max_rows: int = 0) -> tuple[list[int], list[int]]:
    """(train indices, held-out indices): a seeded shuffle; the first `eval_rows` are held out."""
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    if max_rows:
        order = order[:max_rows]
    held = min(eval_rows, max(len(order) - 1, 0))
    if len(order) - held < 1:
        raise DraftsmithError(f"only {n} rows: nothing left to train on after holding out {held}")
    return order[held:], order[:held]


def _as_tensor(x, dtype) -> torch.Tensor:
    return x.to(dtype) if isinstance(x, torch.Tensor) else torch.as_tensor(x, dtype=dtype)


def collate(rows: list[dict], *, max_length: int, layers: Sequence[int] = (), pad_id: int = 0) -> FeatureBatch:
    """Right-pad rows to the longest (cut at max_length) -> FeatureBatch with its attention_mask (B, T).

    Hidden states are stacked when the rows carry them (offline); otherwise the dict is empty.
    """
    lengths = [min(len(r["input_ids"]), max_length) for r in rows]
    T = max(lengths)
    B = len(rows)
    input_ids = torch.full((B, T), pad_id, dtype=torch.long)
    loss_mask = torch.zeros(B, T, dtype=torch.long)
    attention_mask = torch.zeros(B, T, dtype=torch.long)
    top1 = torch.zeros(B, T, dtype=torch.long) if all("target_top1" in r for r in rows) else None
    hidden: dict[int, torch.Tensor] = {}
    for b, (row, n) in enumerate(zip(rows, lengths)):
        input_ids[b, :n] = _as_tensor(row["input_ids"], torch.long)[:n]
        loss_mask[b, :n] = _as_tensor(row["loss_mask"], torch.long)[:n]
        attention_mask[b, :n] = 1
        if top1 is not None:
            top1[b, :n] = _as_tensor(row["target_top1"], torch.long)[:n]
        for layer in layers if "hidden_states" in row else ():
            h = _as_tensor(row["hidden_states"][layer], torch.float32)
            if layer not in hidden:
                hidden[layer] = torch.zeros(B, T, h.shape[-1], dtype=torch.float32)
            hidden[layer][b, :n] = h[:n]
    return FeatureBatch(input_ids, loss_mask, hidden, attention_mask, top1)


@torch.no_grad()  # no autograd graph through the frozen target (inference_mode tensors could not enter backward)
def target_features(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    layers: Sequence[int]) -> dict[int, torch.Tensor]:
    """The target's hidden states at `layers` (our convention; FINAL = last normed state): (B, T, h) each."""
    decoder = model.get_decoder()  # the base model: no lm_head over every position
    with suspended(model):  # features decide no token: the ordinary kernels (serve/core/invariant.py)
        out = decoder(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True, use_cache=False)
    return pick_hidden_states(out.hidden_states, layers)
