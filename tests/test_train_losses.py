"""The training maths as pure functions: shifts, masks, losses, normalization, the TTT attention mask."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from draftsmith.serve.drafters.masks import causal_allowed, ttt_allowed
from draftsmith.serve.methods import losses


def test_shift_left_and_row_mask():
    x = torch.tensor([[1, 2, 3, 4, 5]])
    assert losses.shift_left(x, 2).tolist() == [[3, 4, 5, 0, 0]]
    assert losses.shift_left(x, 7).tolist() == [[0, 0, 0, 0, 0]]
    mask = torch.tensor([[0, 0, 1, 1, 1]])
    # row t at step j predicts x_{t+2+j}: counted when that token is trained
    assert losses.row_mask(mask, 0).tolist() == [[1, 1, 1, 0, 0]]
    assert losses.row_mask(mask, 1).tolist() == [[1, 1, 0, 0, 0]]


def test_soft_cross_entropy_matches_hard_ce_for_one_hot_targets():
    logits = torch.randn(2, 3, 7)
    labels = torch.randint(0, 7, (2, 3))
    one_hot = F.one_hot(labels, 7).float() * 50.0  # softmax of this is one-hot to float precision
    mask = torch.tensor([[1, 0, 1], [1, 1, 0]]).float()
    soft = losses.soft_cross_entropy(logits, one_hot, mask)
    hard = losses.hard_cross_entropy(logits, labels, mask)
    ref = (F.cross_entropy(logits.reshape(-1, 7), labels.reshape(-1), reduction="none") * mask.reshape(-1)).sum()
    assert torch.allclose(soft, ref, atol=1e-4) and torch.allclose(hard, ref, atol=1e-5)


def test_feature_smooth_l1_and_hits_respect_the_mask():
    pred, target = torch.zeros(1, 3, 4), torch.ones(1, 3, 4) * 3
    mask = torch.tensor([[1.0, 0.0, 1.0]])
    assert float(losses.feature_smooth_l1(pred, target, mask)) == 2 * 2.5  # |d| - 0.5 per element, 2 rows
    hits, rows = losses.top1_hits(torch.tensor([[1, 2, 3]]), torch.tensor([[1, 9, 3]]), torch.tensor([[1, 1, 0]]))
    assert (int(hits), int(rows)) == (1, 2)


def test_normalize_gives_the_global_per_token_mean():
    sums = {"a": torch.tensor(6.0), "b": torch.tensor(4.0)}
    total = losses.normalize(sums, {"a": 3, "b": 2}, {"a": 1.0, "b": 0.5})
    assert float(total) == 6 / 3 + 0.5 * 4 / 2
    assert float(losses.normalize(sums, {"a": 3, "b": 2}, {"a": 1.0, "b": 0.5}, scale=4)) == 4 * float(total)
    assert losses.step_weights(3, 0.8) == [1.0, 0.8, 0.8 ** 2]


def test_uniform_noise_is_seeded_and_bounded():
    gen = lambda: torch.Generator().manual_seed(3)  # noqa: E731
    a = losses.uniform_noise((5, 4), half_width=0.1, generator=gen(), device="cpu", dtype=torch.float32)
    b = losses.uniform_noise((5, 4), half_width=0.1, generator=gen(), device="cpu", dtype=torch.float32)
    assert torch.equal(a, b) and a.abs().max() <= 0.1 and a.std() > 0.01


def test_ttt_mask_sees_context_causally_and_its_own_drafts_only():
    m = ttt_allowed(3, 2)  # keys: [step0 x3 | step1 x3 | step2 x3]
    assert m.shape == (3, 9)
    assert m[:, :3].tolist() == causal_allowed(3, 0).tolist()
    assert m[:, 3:6].tolist() == torch.eye(3, dtype=torch.bool).tolist()
    assert m[:, 6:].tolist() == torch.eye(3, dtype=torch.bool).tolist()
    assert causal_allowed(2, 3).tolist() == [[True] * 4 + [False], [True] * 5]
