"""DFlash's training objective: blocks at random anchors, each seeing only the context before it.

For an anchor a the block is [x_a, m, ..., m] at positions a..a+B-1 and reads the target's features of positions
< a; slot i (1..B-1) drafts x_{a+i} against the target's distribution after x_{a+i-1} (softmax of its logits at
row a+i-1), weighted decay^(i-1) (DFlash's position decay). Anchors are drawn per row from the positions whose
first drafted token is trained, `anchors` of them (fewer on short rows), seeded per row so a resumed run and N
processes draw the same ones. Each slot's loss is summed over anchors and divided by the anchors drawn: a mean per
block.
"""
from __future__ import annotations

import torch

from draftsmith.serve.core.layers import FINAL
from draftsmith.serve.drafters.masks import additive
from draftsmith.serve.methods import losses
from draftsmith.serve.methods.objective import FeatureBatch, Objective, ObjectiveSettings

EVAL_ANCHORS = 64  # anchors per forward when every position is an anchor (held-out agreement)


def anchor_candidates(weights: torch.Tensor) -> torch.Tensor:
    """(B, T) loss weight of each position -> (B, T) bool: a >= 1 (the block has context, as in decoding) whose first
    drafted token x_{a+1} is trained."""
    out = torch.zeros_like(weights, dtype=torch.bool)
    out[:, 1:-1] = weights[:, 2:] > 0
    return out


def draw_anchors(candidates: torch.Tensor, count: int, seeds: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) bool -> anchors (B, count) long in ascending order and valid (B, count) bool: min(count, candidates) of
    each row's candidates drawn without replacement from its seed (0 when none is given); the rest are padding."""
    rows = candidates.shape[0]
    anchors = torch.zeros(rows, count, dtype=torch.long)
    valid = torch.zeros(rows, count, dtype=torch.bool)
    for b in range(rows):
        where = candidates[b].nonzero().squeeze(-1).cpu()
        gen = torch.Generator().manual_seed(int(seeds[b]) if seeds is not None else 0)
        n = min(count, where.numel())
        anchors[b, :n] = where[torch.randperm(where.numel(), generator=gen)[:n]].sort().values
        valid[b, :n] = True
    return anchors.to(candidates.device), valid.to(candidates.device)


def block_allowed(anchors: torch.Tensor, block: int, context: int) -> torch.Tensor:
    """anchors (B, A) -> (B, A*block, context + A*block) bool: each block's queries see the context positions before
    its anchor and their own block, both ways; nothing of the other blocks."""
    rows, count = anchors.shape
    query_anchor = anchors.repeat_interleave(block, dim=1)  # (B, Q)
    before = torch.arange(context, device=anchors.device)[None, None, :] < query_anchor[..., None]  # (B, Q, C)
    blocks = torch.arange(count * block, device=anchors.device) // block
    own = (blocks[:, None] == blocks[None, :]).expand(rows, -1, -1)  # (B, Q, Q)
    return torch.cat([before, own], dim=-1)


def block_inputs(input_ids: torch.Tensor, anchors: torch.Tensor, block: int, mask_token_id: int
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) ids and (B, A) anchors -> the blocks' tokens and positions, both (B, A*block): [x_a, m, ..., m] at
    a..a+block-1."""
    tokens = torch.full((*anchors.shape, block), mask_token_id, dtype=torch.long, device=input_ids.device)
    tokens[..., 0] = input_ids.gather(1, anchors)
    positions = anchors[..., None] + torch.arange(block, device=anchors.device)
    return tokens.flatten(1), positions.flatten(1)


class DFlashObjective(Objective):
    """DFlash: block drafting at random anchors, one term per drafted slot (`slot1`..`slot{B-1}`)."""

    def __init__(self, head, parts, *, anchors: int = 32, decay: float = 0.8, prompt_weight: float = 0.0,
                 kind: str = "ce", lk_eta: float = 3.0, position_weighting: str = "decay",
                 dpace_smoothing: float = 0.5):
        super().__init__(head, parts)
        self.anchors, self.decay, self.prompt_weight = anchors, decay, prompt_weight
        self.kind, self.lk_eta = kind, lk_eta
        self.dpace = position_weighting == "dpace"  # else decay^(i-1) per slot
        self.dpace_smoothing = dpace_smoothing
        self.block = head.config.block_size

    def term_weights(self) -> dict[str, float]:
        return {f"slot{i}": 1.0 if self.dpace else self.decay ** (i - 1) for i in range(1, self.block)}

    def _weights(self, loss_mask: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        return losses.position_weights(loss_mask, attention_mask, self.prompt_weight)

    def term_counts(self, batch: FeatureBatch) -> dict[str, torch.Tensor]:
        drawn = anchor_candidates(self._weights(batch.loss_mask, batch.attention_mask)).sum(1).clamp(max=self.anchors)
        return {f"slot{i}": drawn.sum().float() for i in range(1, self.block)}

    def _blocks(self, input_ids, hidden_states, anchors: torch.Tensor) -> torch.Tensor:
        """The head's output for blocks at `anchors` (B, A) -> (B, A, block, h)."""
        rows, length = input_ids.shape
        param = next(self.head.parameters())
        context = self.head.context({k: hidden_states[k].to(param.dtype) for k in self.head.config.aux_layer_ids})
        positions = torch.arange(length, device=input_ids.device).expand(rows, length)
        context_kv = self.head.context_kv(context, positions)
        tokens, block_positions = block_inputs(input_ids, anchors, self.block, self.head.config.mask_token_id)
        mask = additive(block_allowed(anchors, self.block, length), param.dtype)  # (B, 1, Q, C + Q)
        out = self.head(self.parts.embed(tokens).to(param.dtype), block_positions, context_kv, mask)
        return out.view(*anchors.shape, self.block, -1)

    def forward(self, input_ids, loss_mask, hidden_states: dict[int, torch.Tensor], attention_mask=None,
                noise_seeds=None, target_top1=None):
        length = input_ids.shape[1]
        weights = self._weights(loss_mask, attention_mask)
        anchors, valid = draw_anchors(anchor_candidates(weights), self.anchors, noise_seeds)
        out = self._blocks(input_ids, hidden_states, anchors)  # (B, A, block, h)
        final = hidden_states[FINAL]
        logits, teachers, masks = [], [], []
        for i in range(1, self.block):
            # slot i drafts x_{a+i}: the target's distribution for it is its logits at row a+i-1
            row = (anchors + i - 1).clamp(max=length - 1)
            teachers.append(self.parts.logits(final.gather(1, row[..., None].expand(-1, -1, final.shape[-1]))))
            logits.append(self.parts.logits(out[:, :, i]))  # (B, A, V) each
            masks.append(weights.gather(1, (anchors + i).clamp(max=length - 1)) * valid * (anchors + i < length))
        if self.dpace:  # an anchor's block is its chain of slots
            alpha = torch.stack([losses.draft_acceptance(q, p) for q, p in zip(logits, teachers)], dim=-1)
            chain = losses.dpace_weights(alpha, torch.stack(masks, dim=-1), smoothing=self.dpace_smoothing)
            masks = [m * chain[..., i] for i, m in enumerate(masks)]
        return {f"slot{i + 1}": losses.distribution_loss(q, p, m, kind=self.kind, eta=self.lk_eta)
                for i, (q, p, m) in enumerate(zip(logits, teachers, masks))}

    @torch.no_grad()
    def draft_ids(self, batch: FeatureBatch, steps: int) -> list[torch.Tensor]:
        """Row t's block is anchored at t+1 (its context ends at t, its slot j+1 drafts x_{t+2+j}); every row is
        drafted, EVAL_ANCHORS blocks a forward."""
        rows, length = batch.input_ids.shape
        steps = min(steps, self.block - 1)
        drafts = [torch.zeros(rows, length, dtype=torch.long, device=batch.input_ids.device) for _ in range(steps)]
        for start in range(0, length - 1, EVAL_ANCHORS):
            rows_here = torch.arange(start, min(start + EVAL_ANCHORS, length - 1), device=batch.input_ids.device)
            anchors = (rows_here + 1).expand(rows, -1)  # (B, A)
            out = self._blocks(batch.input_ids, batch.hidden_states, anchors)
            for j in range(steps):
                drafts[j][:, rows_here] = self.parts.logits(out[:, :, j + 1]).argmax(-1)
        return drafts


def dflash_objective(head, parts, settings: ObjectiveSettings) -> DFlashObjective:
    return DFlashObjective(head, parts, anchors=settings.anchors, decay=settings.decay,
                           prompt_weight=settings.prompt_weight, kind=settings.kind, lk_eta=settings.lk_eta,
                           position_weighting=settings.position_weighting, dpace_smoothing=settings.dpace_smoothing)
