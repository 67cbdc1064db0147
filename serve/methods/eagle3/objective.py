"""EAGLE-3's training objective: training-time test over the head's own draft vocabulary."""
from __future__ import annotations

import torch

from draftsmith.serve.core.layers import FINAL
from draftsmith.serve.drafters.vocab import draft_token_ids
from draftsmith.serve.methods import losses
from draftsmith.serve.methods.objective import FeatureBatch, ObjectiveSettings, UnrolledObjective


class Eagle3Objective(UnrolledObjective):
    """EAGLE-3: training-time test over `ttt_steps`, soft CE (or an acceptance loss: `kind`, loss_kinds.py) against
    the target restricted to the draft vocabulary, step weights decay^j; rows whose target top-1 lies outside the
    draft vocabulary cannot be matched and are masked (as SpecForge). Noise, when on, is relative to each aux
    feature's scale (their RMS differs by an order of magnitude between low and high layers)."""

    def __init__(self, head, parts, *, ttt_steps: int = 7, decay: float = 0.8, feature_noise: float = 0.0,
                 prompt_weight: float = 0.0, kind: str = "ce", lk_eta: float = 3.0, position_weighting: str = "decay",
                 dpace_smoothing: float = 0.5):
        super().__init__(head, parts, feature_noise=feature_noise, relative_noise=True, prompt_weight=prompt_weight)
        self.steps, self.decay = ttt_steps, decay
        self.kind, self.lk_eta = kind, lk_eta
        self.dpace = position_weighting == "dpace"  # else decay^j per step
        self.dpace_smoothing = dpace_smoothing

    def term_weights(self) -> dict[str, float]:
        weights = [1.0] * self.steps if self.dpace else losses.step_weights(self.steps, self.decay)
        return {f"ttt{j}": w for j, w in enumerate(weights)}

    def _masks(self, loss_mask: torch.Tensor, attention_mask: torch.Tensor | None,
               top1: torch.Tensor | None) -> list[torch.Tensor]:
        weights = self._loss_weights(loss_mask, attention_mask)
        masks = [losses.shift_left(weights, 2 + j, fill=0.0) for j in range(self.steps)]  # row t predicts x_{t+2+j}
        if self.head.config.uses_draft_vocab and top1 is not None:
            inside = self.head.t2d[top1].float()  # (B, T) 1.0 where the target's top-1 is in the draft vocabulary
            masks = [m * losses.shift_left(inside, 1 + j, fill=0.0) for j, m in enumerate(masks)]
        return masks

    @property
    def needs_top1(self) -> bool:
        return self.head.config.uses_draft_vocab

    def _top1_if_needed(self, top1: torch.Tensor | None, final: torch.Tensor) -> torch.Tensor | None:
        if not self.needs_top1 or top1 is not None:
            return top1
        with torch.no_grad():
            return self.parts.logits(final).argmax(-1)

    def term_counts(self, batch: FeatureBatch) -> dict[str, torch.Tensor]:
        top1 = self._top1_if_needed(batch.target_top1, batch.hidden_states[FINAL])
        return {f"ttt{j}": m.sum() for j, m in enumerate(self._masks(batch.loss_mask, batch.attention_mask, top1))}

    def _logits(self, out: torch.Tensor) -> torch.Tensor:
        """(B, T, h) head output -> (B, T, Vd) draft logits."""
        return self.head.logits(out)

    def _teacher_logits(self, final: torch.Tensor) -> torch.Tensor:
        """(B, T, h) the target's final state -> (B, T, Vd) its logits over the draft vocabulary."""
        return self.parts.logits(final, draft_token_ids(self.head.d2t))

    def _draft_top1(self, out: torch.Tensor) -> torch.Tensor:
        draft = self._logits(out).argmax(-1)
        return draft + self.head.d2t[draft]

    def forward(self, input_ids, loss_mask, hidden_states: dict[int, torch.Tensor], attention_mask=None,
                noise_seeds=None, target_top1=None):
        final = hidden_states[FINAL]
        masks = self._masks(loss_mask, attention_mask, self._top1_if_needed(target_top1, final))
        target_logits = self._teacher_logits(final)  # (B, T, Vd)
        lengths = attention_mask.sum(1) if attention_mask is not None else None
        hidden = self._input_hidden(hidden_states, noise_seeds, lengths)
        logits = [self._logits(out) for _, out in self._unroll(input_ids, hidden, self.steps)]  # (B, T, Vd) each
        teachers = [losses.shift_left(target_logits, 1 + j) for j in range(self.steps)]
        if self.dpace:  # row t's chain is its steps 0..S-1
            alpha = torch.stack([losses.draft_acceptance(q, p) for q, p in zip(logits, teachers)], dim=-1)
            weights = losses.dpace_weights(alpha, torch.stack(masks, dim=-1), smoothing=self.dpace_smoothing)
            masks = [m * weights[..., j] for j, m in enumerate(masks)]
        return {f"ttt{j}": losses.distribution_loss(logits[j], teachers[j], masks[j], kind=self.kind, eta=self.lk_eta)
                for j in range(self.steps)}


def eagle3_objective(head, parts, settings: ObjectiveSettings) -> Eagle3Objective:
    return Eagle3Objective(head, parts, ttt_steps=settings.ttt_steps, decay=settings.decay,
                           feature_noise=settings.aux_noise, prompt_weight=settings.prompt_weight, kind=settings.kind,
                           lk_eta=settings.lk_eta, position_weighting=settings.position_weighting,
                           dpace_smoothing=settings.dpace_smoothing)
