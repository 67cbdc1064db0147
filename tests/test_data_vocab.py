"""Draft vocabulary: frequencies over loss-masked tokens, EAGLE-3's d2t/t2d conventions, coverage."""
from __future__ import annotations

import pytest
import torch

from draftsmith.data.vocab import draft_vocab_from_counts, select_draft_vocab
from draftsmith.serve.core.errors import DraftsmithError

ROWS = [
    {"input_ids": [1, 5, 5, 7, 9, 2], "loss_mask": [0, 1, 1, 1, 0, 1]},  # 9 and 1 are outside the loss
    {"input_ids": [9, 9, 5, 3, 2], "loss_mask": [0, 0, 1, 1, 1]},
]  # loss counts: 5 -> 3, 2 -> 2, 7 -> 1, 3 -> 1 (7 tokens)


def test_top_tokens_offsets_and_coverage():
    d2t, t2d, coverage = select_draft_vocab(ROWS, 12, 3)
    kept = torch.arange(3) + d2t  # target_id = draft_id + d2t[draft_id]
    assert kept.tolist() == [2, 3, 5]  # 5 and 2, then 3 beats 7 on the tie (lower id first), ascending order
    assert d2t.dtype == torch.int64 and d2t.shape == (3,) and d2t.tolist() == [2, 2, 3]
    assert t2d.dtype == torch.bool and t2d.shape == (12,) and t2d.nonzero().flatten().tolist() == [2, 3, 5]
    assert coverage == pytest.approx(6 / 7)
    assert select_draft_vocab(ROWS, 12, 4)[2] == pytest.approx(1.0)


def test_fills_with_unseen_ids_and_checks_sizes():
    d2t, t2d, coverage = select_draft_vocab(ROWS, 12, 6)
    assert (torch.arange(6) + d2t).tolist() == [0, 1, 2, 3, 5, 7] and int(t2d.sum()) == 6 and coverage == 1.0
    identity = select_draft_vocab(ROWS, 12, 12)
    assert identity[0].tolist() == [0] * 12 and bool(identity[1].all())
    with pytest.raises(DraftsmithError, match="1..12"):
        select_draft_vocab(ROWS, 12, 13)
    with pytest.raises(DraftsmithError, match="outside the target vocabulary"):
        select_draft_vocab(ROWS, 6, 3)
    with pytest.raises(DraftsmithError, match="no loss-masked tokens"):
        draft_vocab_from_counts(torch.zeros(8, dtype=torch.int64).numpy(), 4)


def test_hf_dataset_folder(tmp_path):
    import datasets

    folder = tmp_path / "ds"
    datasets.Dataset.from_dict({k: [r[k] for r in ROWS] for k in ("input_ids", "loss_mask")}).save_to_disk(str(folder))
    d2t, t2d, coverage = select_draft_vocab(folder, 12, 3)
    d2t2, t2d2, coverage2 = select_draft_vocab(ROWS, 12, 3)
    assert torch.equal(d2t, d2t2) and torch.equal(t2d, t2d2) and coverage2 == pytest.approx(coverage, abs=1e-6)
