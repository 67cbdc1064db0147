"""Medusa's training objective: each head learns the data's token its own number of places ahead."""
from __future__ import annotations

import torch

from draftsmith.serve.core.layers import FINAL
from draftsmith.serve.methods import losses
from draftsmith.serve.methods.objective import FeatureBatch, Objective, ObjectiveSettings


class MedusaObjective(Objective):
    """Medusa-1: head i, CE against the data token x_{t+i+2} (the target's own, self-distilled), weight decay^i."""

    def __init__(self, head, parts, *, decay: float = 0.8):
        super().__init__(head, parts)
        self.decay = decay

    def term_weights(self) -> dict[str, float]:
        return {f"head{i}": w for i, w in enumerate(losses.step_weights(self.head.num_heads, self.decay))}

    def _labels_and_masks(self, input_ids, loss_mask):
        t2d = self.head.t2d
        to_draft = torch.cumsum(t2d.long(), 0) - 1  # (V,) target id -> draft id (valid where t2d)
        out = []
        for i in range(self.head.num_heads):
            labels = losses.shift_left(input_ids, 2 + i, fill=0)
            mask = losses.row_mask(loss_mask, i) * t2d[labels].float()
            out.append((to_draft[labels], mask))
        return out

    def term_counts(self, batch: FeatureBatch) -> dict[str, torch.Tensor]:
        pairs = self._labels_and_masks(batch.input_ids, batch.loss_mask)
        return {f"head{i}": m.sum() for i, (_, m) in enumerate(pairs)}

    def forward(self, input_ids, loss_mask, hidden_states: dict[int, torch.Tensor], attention_mask=None,
                noise_seeds=None, target_top1=None):
        param = next(self.head.parameters())
        logits = self.head(hidden_states[FINAL].to(param.dtype))  # (n, B, T, Vd)
        return {f"head{i}": losses.hard_cross_entropy(logits[i], labels, mask)
                for i, (labels, mask) in enumerate(self._labels_and_masks(input_ids, loss_mask))}

    def draft_ids(self, batch: FeatureBatch, steps: int) -> list[torch.Tensor]:
        param = next(self.head.parameters())
        logits = self.head(batch.hidden_states[FINAL].to(param.dtype))  # (n, B, T, Vd)
        drafts = [logits[i].argmax(-1) for i in range(min(steps, self.head.num_heads))]
        return [d + self.head.d2t[d] for d in drafts]


def medusa_objective(head, parts, settings: ObjectiveSettings) -> MedusaObjective:
    return MedusaObjective(head, parts, decay=settings.decay)
