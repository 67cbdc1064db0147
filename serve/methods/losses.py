"""The training losses as pure tensor functions. Every loss returns a masked SUM; the loop divides by the
number of loss tokens counted over all processes and micro-batches, so 1 process and N processes (or
gradient accumulation) give the same gradient.

Pairing (base.py): feature t belongs to next token x_{t+1}. A head row t reads (feature t, x_{t+1}) and
predicts x_{t+2}; the target's distribution for it is softmax(z_{t+1}) with z = lm_head(final feature).
A row counts when the token it predicts is a trained (assistant) token: loss_mask[t+2].
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from draftsmith.serve.methods.loss_kinds import DISTRIBUTION_LOSSES


def shift_left(x: torch.Tensor, n: int, *, fill=0) -> torch.Tensor:
    """x[:, t] <- x[:, t+n] along dim 1, padding the end with `fill`. (B, T, ...) -> (B, T, ...)."""
    if n == 0:
        return x
    pad = x.new_full((x.shape[0], min(n, x.shape[1]), *x.shape[2:]), fill)
    return torch.cat([x[:, n:], pad], dim=1)[:, : x.shape[1]]


def row_mask(loss_mask: torch.Tensor, step: int) -> torch.Tensor:
    """(B, T) 0/1 -> (B, T) float: row t at unroll step `step` predicts x_{t+2+step}."""
    return shift_left(loss_mask.float(), 2 + step, fill=0.0)


def step_weights(n: int, decay: float = 0.8) -> list[float]:
    """Weights decay^i of unroll steps / Medusa heads i = 0..n-1."""
    return [decay ** i for i in range(n)]


def soft_cross_entropy(logits: torch.Tensor, target_logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """sum over masked rows of -sum_v p_target(v) log q(v). logits, target_logits: (B, T, V); mask: (B, T)."""
    target = torch.softmax(target_logits.float(), dim=-1)
    logq = torch.log_softmax(logits.float(), dim=-1)
    per_row = -(target * logq).sum(-1)  # (B, T)
    return (per_row * mask).sum()


NLA_FLOOR = 1e-6  # -log alpha is clamped here: a draft with no overlap at all has a finite loss


def acceptance(q: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """alpha = sum_v min(p_v, q_v): the probability that a token drafted from q is accepted against p (Leviathan et
    al. 2023). q, p: (..., V) probabilities -> (...)."""
    return torch.minimum(p, q).sum(-1)


def distribution_loss(logits: torch.Tensor, target_logits: torch.Tensor, mask: torch.Tensor, *, kind: str = "ce",
                      eta: float = 3.0) -> torch.Tensor:
    """Sum over masked rows of one loss of the draft's distribution q = softmax(logits) against the target's
    p = softmax(target_logits); logits, target_logits: (B, T, V); mask: (B, T).

    ce: -sum_v p log q. tv: 1 - alpha (total variation). nla: -log alpha (its gradient is TV's over alpha, which keeps
    it strong while the draft is far off). lk_hybrid: lam * KL(p||q) + (1 - lam)(1 - alpha), lam = exp(-eta * sg(alpha))
    per row: KL while acceptance is low, acceptance itself once it grows (Samarin et al., "LK losses")."""
    if kind == "ce":
        return soft_cross_entropy(logits, target_logits, mask)
    p = torch.softmax(target_logits.float(), dim=-1)
    logq = torch.log_softmax(logits.float(), dim=-1)
    alpha = acceptance(logq.exp(), p)  # (B, T)
    if kind == "tv":
        per_row = 1.0 - alpha
    elif kind == "nla":
        per_row = -alpha.clamp_min(NLA_FLOOR).log()
    elif kind == "lk_hybrid":
        lam = torch.exp(-eta * alpha.detach())
        kl = (torch.special.xlogy(p, p) - p * logq).sum(-1)  # (B, T); 0 log 0 = 0
        per_row = lam * kl + (1.0 - lam) * (1.0 - alpha)
    else:
        raise ValueError(f"unknown distribution loss {kind!r}: one of {', '.join(DISTRIBUTION_LOSSES)}")
    return (per_row * mask).sum()


def dpace_weights(alpha: torch.Tensor, mask: torch.Tensor, *, smoothing: float = 0.5) -> torch.Tensor:
    """D-PACE's position weights (Wu et al. 2026, arXiv 2605.18810; Lucas-TY/D-PACE `_dpace_weight`), detached.

    alpha: (..., K) the acceptance of each drafted position of one chain or block (positions 1..K in drafting order);
    mask: (..., K) its loss weight. With s_i = (1 - smoothing) alpha_i + smoothing (1 where masked out), the smoothed
    expected accepted length is L = sum_j mask_j prod_{i<=j} s_i and w_k = dL / dlog s_k = sum_{j>=k} mask_j
    prod_{i<=j} s_i: a position weighs what the accepted length after it is worth, so the positions that limit
    acceptance get the signal as the drafter improves (a fixed decay cannot follow them)."""
    with torch.no_grad():
        kept = mask > 0
        smooth = torch.where(kept, (1.0 - smoothing) * alpha.float() + smoothing, torch.ones_like(alpha.float()))
        prefix = torch.cumprod(smooth, dim=-1) * kept
        return prefix.flip(-1).cumsum(-1).flip(-1)


def draft_acceptance(logits: torch.Tensor, target_logits: torch.Tensor) -> torch.Tensor:
    """(..., V) draft and target logits -> (...) alpha of the draft against the target, detached."""
    with torch.no_grad():
        return acceptance(torch.softmax(logits.float(), dim=-1), torch.softmax(target_logits.float(), dim=-1))


def position_weights(loss_mask: torch.Tensor, attention_mask: torch.Tensor | None,
                     prompt_weight: float) -> torch.Tensor:
    """(B, T) weight of each position as a predicted token: 1 on trained (assistant) tokens, prompt_weight on the
    other real tokens. The soft targets are the target's own distribution at every position, so prompt positions are
    valid distillation rows too: cheap extra data where answers are short and prompts long."""
    if prompt_weight <= 0 or attention_mask is None:
        return loss_mask.float()
    return loss_mask.float() + prompt_weight * (attention_mask.float() - loss_mask.float())


def feature_smooth_l1(pred: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """EAGLE-1 feature regression: sum over masked rows of the mean SmoothL1 between the predicted and the teacher's
    features. (B, T, h)."""
    per_row = F.smooth_l1_loss(pred.float(), teacher.float(), reduction="none").mean(-1)  # (B, T)
    return (per_row * mask).sum()


def hard_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """sum over masked rows of -log q(label). logits: (B, T, V); labels: (B, T) long (any value where masked)."""
    logq = torch.log_softmax(logits.float(), dim=-1)
    picked = logq.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)  # (B, T)
    return -(picked * mask).sum()


def top1_hits(draft_ids: torch.Tensor, target_ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(hits, rows): masked rows whose draft top-1 equals the target's top-1. All (B, T)."""
    m = mask > 0
    return (draft_ids.eq(target_ids) & m).sum(), m.sum()


def uniform_noise(shape, *, half_width: float, generator: torch.Generator, device, dtype) -> torch.Tensor:
    """EAGLE-1's feature noise, U(-a, a) (paper §4.2), drawn from a seeded generator so resumes repeat it."""
    noise = torch.rand(shape, generator=generator, device=generator.device, dtype=torch.float32)
    return ((noise * 2 - 1) * half_width).to(device=device, dtype=dtype)


def normalize(sums: dict[str, torch.Tensor], counts: dict[str, float], weights: dict[str, float],
              *, scale: float = 1.0) -> torch.Tensor:
    """sum_i w_i * sum_i / count_i * scale: the loss whose gradient is the global per-token mean."""
    total = None
    for name, value in sums.items():
        term = value * (weights[name] * scale / max(counts[name], 1.0))
        total = term if total is None else total + term
    return total
