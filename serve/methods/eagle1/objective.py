"""EAGLE-1's training objective: the next feature (SmoothL1) and the target's distribution through its lm_head."""
from __future__ import annotations

import torch

from draftsmith.serve.core.layers import FINAL
from draftsmith.serve.methods import losses
from draftsmith.serve.methods.objective import FeatureBatch, ObjectiveSettings, UnrolledObjective


class Eagle1Objective(UnrolledObjective):
    """EAGLE-1: SmoothL1 on the next feature + ce_weight x a loss against the target's distribution through its
    lm_head (soft CE, or an acceptance loss: `kind`, loss_kinds.py; its term keeps the name "ce"), one
    step."""

    def __init__(self, head, parts, *, feature_noise: float = 0.1, feature_weight: float = 1.0,
                 ce_weight: float = 0.1, prompt_weight: float = 0.0, kind: str = "ce", lk_eta: float = 3.0):
        super().__init__(head, parts, feature_noise=feature_noise, prompt_weight=prompt_weight)
        self.feature_weight, self.ce_weight = feature_weight, ce_weight
        self.kind, self.lk_eta = kind, lk_eta

    def term_weights(self) -> dict[str, float]:
        return {"feature": self.feature_weight, "ce": self.ce_weight}

    def term_counts(self, batch: FeatureBatch) -> dict[str, torch.Tensor]:
        count = losses.shift_left(self._loss_weights(batch.loss_mask, batch.attention_mask), 2, fill=0.0).sum()
        return {"feature": count, "ce": count}

    def _draft_top1(self, out: torch.Tensor) -> torch.Tensor:
        return self.parts.logits(out).argmax(-1)

    def forward(self, input_ids, loss_mask, hidden_states: dict[int, torch.Tensor], attention_mask=None,
                noise_seeds=None, target_top1=None):
        """Loss sums per term. noise_seeds: (B,) per-row seeds of the feature noise."""
        final = hidden_states[FINAL]
        mask = losses.shift_left(self._loss_weights(loss_mask, attention_mask), 2, fill=0.0)  # rows predicting x_{t+2}
        lengths = attention_mask.sum(1) if attention_mask is not None else None
        hidden = self._input_hidden(hidden_states, noise_seeds, lengths)
        (_, out), = self._unroll(input_ids, hidden, 1)
        return {"feature": losses.feature_smooth_l1(out, losses.shift_left(final, 1), mask),
                "ce": losses.distribution_loss(self.parts.logits(out), losses.shift_left(self.parts.logits(final), 1),
                                               mask, kind=self.kind, eta=self.lk_eta)}


def eagle1_objective(head, parts, settings: ObjectiveSettings) -> Eagle1Objective:
    return Eagle1Objective(head, parts, feature_noise=settings.feature_noise, feature_weight=settings.feature_weight,
                           ce_weight=settings.ce_weight, prompt_weight=settings.prompt_weight, kind=settings.kind,
                           lk_eta=settings.lk_eta)
