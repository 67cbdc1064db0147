"""The MTP layer's training objective: EAGLE-3's training-time test over the target's whole vocabulary, through its
lm_head: step j of row t drafts x_{t+2+j}, the layer run on its own outputs after the first (as it drafts, and as
speculators and SpecForge fine-tune MTP layers); soft CE (or an acceptance loss) against the target's distribution
there, step weights decay^j (or D-PACE's)."""
from __future__ import annotations

import torch

from draftsmith.serve.methods.eagle3.objective import Eagle3Objective
from draftsmith.serve.methods.objective import ObjectiveSettings


class MtpObjective(Eagle3Objective):
    """Eagle3Objective with the target's lm_head over the layer's normed output and no draft vocabulary."""

    def _logits(self, out: torch.Tensor) -> torch.Tensor:
        return self.parts.logits(self.head.lm_head_input(out))  # (B, T, V)

    def _teacher_logits(self, final: torch.Tensor) -> torch.Tensor:
        return self.parts.logits(final)  # (B, T, V)

    def _draft_top1(self, out: torch.Tensor) -> torch.Tensor:
        return self._logits(out).argmax(-1)


def mtp_objective(head, parts, settings: ObjectiveSettings) -> MtpObjective:
    return MtpObjective(head, parts, ttt_steps=head.config.ttt_steps, decay=settings.decay,
                        prompt_weight=settings.prompt_weight, kind=settings.kind, lk_eta=settings.lk_eta,
                        position_weighting=settings.position_weighting, dpace_smoothing=settings.dpace_smoothing)
