"""The toy's training objective: cross-entropy against the data's token two places after each feature."""
from __future__ import annotations

import torch

from draftsmith.serve.core.layers import FINAL
from draftsmith.serve.methods import losses
from draftsmith.serve.methods.objective import FeatureBatch, Objective


class ToyObjective(Objective):
    def term_weights(self) -> dict[str, float]:
        return {"next2": 1.0}

    def _labels_and_mask(self, input_ids, loss_mask):
        return losses.shift_left(input_ids, 2, fill=0), losses.row_mask(loss_mask, 0)

    def term_counts(self, batch: FeatureBatch) -> dict[str, torch.Tensor]:
        return {"next2": self._labels_and_mask(batch.input_ids, batch.loss_mask)[1].sum()}

    def forward(self, input_ids, loss_mask, hidden_states, attention_mask=None, noise_seeds=None, target_top1=None):
        labels, mask = self._labels_and_mask(input_ids, loss_mask)
        logits = self.head(hidden_states[FINAL].to(self.head.proj.weight.dtype))  # (B, T, V)
        return {"next2": losses.hard_cross_entropy(logits, labels, mask)}

    def draft_ids(self, batch: FeatureBatch, steps: int) -> list[torch.Tensor]:
        return [self.head(batch.hidden_states[FINAL].to(self.head.proj.weight.dtype)).argmax(-1)][:steps]
