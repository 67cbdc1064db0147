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


def _probs(logits: torch.Tensor) -> torch.Tensor:
    return torch.softmax(logits.float(), dim=-1)


def test_acceptance_is_one_minus_total_variation_and_each_loss_is_its_definition():
    torch.manual_seed(0)
    logits, target_logits = torch.randn(2, 3, 11), torch.randn(2, 3, 11) * 2
    mask = torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 0.5]])
    q, p = _probs(logits), _probs(target_logits)
    alpha = losses.acceptance(q, p)  # (2, 3)
    assert torch.allclose(alpha, 1 - 0.5 * (p - q).abs().sum(-1), atol=1e-6)
    kl = (p * (p.log() - q.log())).sum(-1)
    lam = torch.exp(-3.0 * alpha)
    expected = {"ce": -(p * q.log()).sum(-1), "tv": 1 - alpha, "nla": -alpha.log(),
                "lk_hybrid": lam * kl + (1 - lam) * (1 - alpha)}
    for kind, per_row in expected.items():
        got = losses.distribution_loss(logits, target_logits, mask, kind=kind)
        assert torch.allclose(got, (per_row * mask).sum(), atol=1e-5), kind


def test_acceptance_losses_vanish_where_the_draft_is_the_target_and_nla_is_ce_on_a_point_mass():
    logits = torch.randn(1, 4, 9)
    mask = torch.ones(1, 4)
    for kind in ("tv", "nla", "lk_hybrid"):
        assert abs(float(losses.distribution_loss(logits, logits.clone(), mask, kind=kind))) < 1e-5, kind
    labels = torch.randint(0, 9, (1, 4))
    one_hot = F.one_hot(labels, 9).float() * 60.0
    nla = losses.distribution_loss(logits, one_hot, mask, kind="nla")
    assert torch.allclose(nla, losses.hard_cross_entropy(logits, labels, mask), atol=1e-4)


def test_nla_gradient_is_tvs_over_alpha_and_lk_weight_is_not_differentiated():
    torch.manual_seed(1)
    target_logits = torch.randn(1, 1, 7)
    mask = torch.ones(1, 1)
    grads = {}
    for kind in ("tv", "nla"):
        logits = torch.randn(1, 1, 7, generator=torch.Generator().manual_seed(2)).requires_grad_()
        losses.distribution_loss(logits, target_logits, mask, kind=kind).backward()
        grads[kind] = logits.grad
    alpha = losses.acceptance(_probs(logits.detach()), _probs(target_logits))
    assert torch.allclose(grads["nla"], grads["tv"] / alpha, atol=1e-6)
    # lk_hybrid at eta = 0 is the KL alone (lam = 1): its gradient is the soft CE's, q - p
    logits = torch.randn(1, 1, 7).requires_grad_()
    losses.distribution_loss(logits, target_logits, mask, kind="lk_hybrid", eta=0.0).backward()
    assert torch.allclose(logits.grad, _probs(logits.detach()) - _probs(target_logits), atol=1e-6)


def test_dpace_weights_are_the_gradient_of_the_smoothed_accepted_length():
    """w_k = dL/dlog s_k with L = sum_j mask_j prod_{i<=j} s_i, s = (1 - smoothing) alpha + smoothing; masked-out
    positions multiply by 1 and add nothing."""
    alpha = torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [0.6, 0.2, 0.9]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [1.0, 0.0, 1.0]])
    weights = losses.dpace_weights(alpha, mask, smoothing=0.5)
    assert torch.allclose(weights[0], torch.tensor([3.0, 2.0, 1.0]))  # all accepted: the positions after each
    assert torch.allclose(weights[1], torch.tensor([0.75, 0.25, 0.0]))  # s = 0.5: 0.5 + 0.25, then 0.25
    log_s = torch.where(mask > 0, (0.5 * alpha + 0.5).log(), torch.zeros_like(alpha)).requires_grad_()
    length = (torch.cumprod(log_s.exp(), dim=-1) * mask).sum()
    length.backward()
    assert torch.allclose(weights, log_s.grad) and not weights.requires_grad
    # smoothing 1 ignores the draft (every s = 1): the weights count the trained positions from each on
    assert torch.equal(losses.dpace_weights(alpha, mask, smoothing=1.0)[0], torch.tensor([3.0, 2.0, 1.0]))
