"""P-EAGLE's training objective: every depth in one forward, without the unrolled training-time test.

The forward holds the row's T real pairs (depth 0: pair t drafts x_{t+2}, every position trained, as EAGLE-3's
first step) and, for `anchors` positions a drawn per row, a block of K-1 mask slots at positions a+1..a+K-1 (slot
d drafts x_{a+2+d}). A slot sees the real pairs up to its anchor and the earlier slots of its block, exactly what
it sees when drafting. Anchors are drawn among the positions whose depth-1 token is trained, seeded per row (a
resumed run and N processes draw the same ones); the same anchors serve every depth (the paper and speculators
thin them out with depth, to save memory a CPU does not lack at K <= 8). Term `depth{d}` weighs decay^d; the
losses are EAGLE-3's (soft CE or an acceptance loss against the target over the draft vocabulary).
"""
from __future__ import annotations

import torch

from draftsmith.serve.core.layers import FINAL
from draftsmith.serve.drafters.masks import additive, causal_allowed
from draftsmith.serve.drafters.vocab import draft_token_ids
from draftsmith.serve.methods import losses
from draftsmith.serve.methods.dflash.objective import EVAL_ANCHORS, draw_anchors
from draftsmith.serve.methods.eagle3.objective import Eagle3Objective
from draftsmith.serve.methods.objective import FeatureBatch, ObjectiveSettings


def parallel_allowed(anchors: torch.Tensor, depths: int, length: int) -> torch.Tensor:
    """anchors (B, A) -> (B, T + A*(K-1), T + A*(K-1)) bool over [real pairs | blocks of K-1 slots]: real pairs are
    causal among themselves; slot d of anchor a sees the real pairs 0..a and its block's slots 1..d."""
    rows, count = anchors.shape
    slots = depths - 1
    device = anchors.device
    real = torch.cat([causal_allowed(length, 0, device=device),
                      torch.zeros(length, count * slots, dtype=torch.bool, device=device)], dim=1)
    slot_anchor = anchors.repeat_interleave(slots, dim=1)  # (B, A*(K-1))
    before = torch.arange(length, device=device)[None, None, :] <= slot_anchor[..., None]  # (B, A*(K-1), T)
    index = torch.arange(count * slots, device=device)
    block, depth = index // slots, index % slots
    own = (block[:, None] == block[None, :]) & (depth[None, :] <= depth[:, None])  # (A*(K-1), A*(K-1))
    return torch.cat([real.expand(rows, -1, -1), torch.cat([before, own.expand(rows, -1, -1)], dim=-1)], dim=1)


class PEagleObjective(Eagle3Objective):
    """P-EAGLE: depth 0 on every position, depths 1..K-1 on the mask slots of random anchors."""

    def __init__(self, head, parts, *, anchors: int = 32, decay: float = 0.8, feature_noise: float = 0.0,
                 prompt_weight: float = 0.0, kind: str = "ce", lk_eta: float = 3.0):
        super().__init__(head, parts, ttt_steps=head.config.num_speculative_tokens, decay=decay,
                         feature_noise=feature_noise, prompt_weight=prompt_weight, kind=kind, lk_eta=lk_eta)
        self.anchors = anchors

    def term_weights(self) -> dict[str, float]:
        return {f"depth{d}": w for d, w in enumerate(losses.step_weights(self.steps, self.decay))}

    def _candidates(self, masks: list[torch.Tensor]) -> torch.Tensor:
        return masks[1] > 0 if self.steps > 1 else torch.zeros_like(masks[0], dtype=torch.bool)

    def term_counts(self, batch: FeatureBatch) -> dict[str, torch.Tensor]:
        top1 = self._top1_if_needed(batch.target_top1, batch.hidden_states[FINAL])
        masks = self._masks(batch.loss_mask, batch.attention_mask, top1)
        drawn = self._candidates(masks).sum(1).clamp(max=self.anchors).sum().float()
        return {"depth0": masks[0].sum(), **{f"depth{d}": drawn for d in range(1, self.steps)}}

    def _run(self, input_ids: torch.Tensor, hidden: torch.Tensor, anchors: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden: (B, T, h) fused real features; anchors (B, A) -> outputs of the real pairs (B, T, h) and of the
        slots (B, A, K-1, h)."""
        rows, length = input_ids.shape
        slots = self.steps - 1
        param = next(self.head.parameters())
        masked = torch.full((rows, anchors.shape[1] * slots), self.head.config.mask_token_id, dtype=torch.long,
                            device=input_ids.device)
        tokens = torch.cat([losses.shift_left(input_ids, 1, fill=0), masked], dim=1)  # pair t reads x_{t+1}
        fused = self.head.mask_input().to(hidden.dtype).expand(rows, masked.shape[1], -1)
        slot_positions = (anchors[..., None] + torch.arange(1, slots + 1, device=anchors.device)).flatten(1)
        positions = torch.cat([torch.arange(length, device=input_ids.device).expand(rows, length), slot_positions], 1)
        mask = additive(parallel_allowed(anchors, self.steps, length), param.dtype)  # (B, 1, Q, Q)
        out = self.head(torch.cat([hidden, fused], dim=1), self.parts.embed(tokens).to(param.dtype),
                        position_ids=positions, attention_mask=mask)
        return out[:, :length], out[:, length:].view(rows, anchors.shape[1], slots, -1)

    def forward(self, input_ids, loss_mask, hidden_states: dict[int, torch.Tensor], attention_mask=None,
                noise_seeds=None, target_top1=None):
        final = hidden_states[FINAL]
        masks = self._masks(loss_mask, attention_mask, self._top1_if_needed(target_top1, final))
        anchors, valid = draw_anchors(self._candidates(masks), self.anchors, noise_seeds)
        lengths = attention_mask.sum(1) if attention_mask is not None else None
        real, slots = self._run(input_ids, self._input_hidden(hidden_states, noise_seeds, lengths), anchors)
        vocab = draft_token_ids(self.head.d2t)
        length = input_ids.shape[1]
        sums = {"depth0": losses.distribution_loss(self.head.logits(real),
                                                   losses.shift_left(self.parts.logits(final, vocab), 1), masks[0],
                                                   kind=self.kind, eta=self.lk_eta)}
        for d in range(1, self.steps):
            # slot d of anchor a drafts x_{a+2+d}: the target's distribution for it is its logits at row a+1+d
            row = (anchors + 1 + d).clamp(max=length - 1)
            teacher = self.parts.logits(final.gather(1, row[..., None].expand(-1, -1, final.shape[-1])), vocab)
            mask = masks[d].gather(1, anchors) * valid
            sums[f"depth{d}"] = losses.distribution_loss(self.head.logits(slots[:, :, d - 1]), teacher, mask,
                                                         kind=self.kind, eta=self.lk_eta)
        return sums

    @torch.no_grad()
    def draft_ids(self, batch: FeatureBatch, steps: int) -> list[torch.Tensor]:
        """Row t is every depth's anchor (depth d drafts x_{t+2+d}), EVAL_ANCHORS blocks a forward."""
        rows, length = batch.input_ids.shape
        steps = min(steps, self.steps)
        hidden = self._input_hidden(batch.hidden_states, None, None)
        drafts = [torch.zeros(rows, length, dtype=torch.long, device=batch.input_ids.device) for _ in range(steps)]
        for start in range(0, length, EVAL_ANCHORS):
            here = torch.arange(start, min(start + EVAL_ANCHORS, length), device=batch.input_ids.device)
            real, slots = self._run(batch.input_ids, hidden, here.expand(rows, -1))
            if start == 0:
                drafts[0] = self._draft_top1(real)
            for d in range(1, steps):
                drafts[d][:, here] = self._draft_top1(slots[:, :, d - 1])
        return drafts


def peagle_objective(head, parts, settings: ObjectiveSettings) -> PEagleObjective:
    return PEagleObjective(head, parts, anchors=settings.anchors, decay=settings.decay,
                           feature_noise=settings.aux_noise, prompt_weight=settings.prompt_weight, kind=settings.kind,
                           lk_eta=settings.lk_eta)
