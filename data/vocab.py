"""EAGLE-3 draft vocabulary: the `draft_vocab_size` target tokens most frequent where the loss counts.

Conventions (EAGLE-3, vLLM, SGLang): draft ids are the kept target ids in ascending order;
`d2t[i] = target_id - i` (int64, (Vd,)), so target_id = i + d2t[i]; `t2d` is a bool (V,) mask of the
target ids that are in the draft vocabulary. Coverage: the share of loss-masked target tokens that the
draft vocabulary can express (the ceiling on acceptance it imposes).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

import numpy as np
import torch

from draftsmith.serve.core.errors import DraftsmithError

def token_counts(dataset: Any, vocab_size: int) -> np.ndarray:
    """(V,) int64 counts of the tokens under loss_mask == 1 in an HF dataset, a dataset folder, or rows."""
    if isinstance(dataset, (str, Path)):
        import datasets

        dataset = datasets.load_from_disk(str(dataset))
    counts = np.zeros(vocab_size, dtype=np.int64)
    for input_ids, loss_mask in _columns(dataset):
        ids = np.asarray(input_ids, dtype=np.int64)
        mask = np.asarray(loss_mask).astype(bool)
        kept = ids[mask]
        if kept.size and (kept.max() >= vocab_size or kept.min() < 0):
            raise DraftsmithError(f"token id {int(kept.max())} is outside the target vocabulary ({vocab_size}): "
                                  f"the data was tokenized for another target")
        counts += np.bincount(kept, minlength=vocab_size)
    return counts


def _columns(dataset: Any) -> Iterable[tuple[Any, Any]]:
    if hasattr(dataset, "iter") and hasattr(dataset, "column_names"):  # HF datasets: read in blocks
        for block in dataset.select_columns(["input_ids", "loss_mask"]).iter(batch_size=1024):
            yield from zip(block["input_ids"], block["loss_mask"])
        return
    for row in dataset:
        yield row["input_ids"], row["loss_mask"]


def draft_vocab_from_counts(counts: np.ndarray, draft_vocab_size: int) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(d2t, t2d, coverage) keeping the `draft_vocab_size` most frequent ids (ties: lower id first)."""
    vocab_size = counts.shape[0]
    if not 0 < draft_vocab_size <= vocab_size:
        raise DraftsmithError(f"draft vocabulary size must be in 1..{vocab_size} (the target's), got {draft_vocab_size}")
    total = int(counts.sum())
    if total == 0:
        raise DraftsmithError("no loss-masked tokens to count: the dataset has no assistant tokens")
    order = np.lexsort((np.arange(vocab_size), -counts))  # by count descending, then id ascending
    # Ids never seen fill the remainder in ascending id order (counts are all 0 there).
    kept = np.sort(order[:draft_vocab_size])
    coverage = float(counts[kept].sum()) / total
    d2t = torch.from_numpy(kept - np.arange(draft_vocab_size)).to(torch.int64)
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[torch.from_numpy(kept)] = True
    return d2t, t2d, coverage


def select_draft_vocab(dataset: Any, vocab_size: int, draft_vocab_size: int) -> tuple[torch.Tensor, torch.Tensor, float]:
    """EAGLE-3 d2t (Vd,) int64, t2d (V,) bool and coverage from the loss-masked tokens of `dataset`."""
    return draft_vocab_from_counts(token_counts(dataset, vocab_size), draft_vocab_size)
