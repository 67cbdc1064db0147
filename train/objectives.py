"""One nn.Module per method that turns a batch of target features into loss sums: the unit that DDP /
DeepSpeed / FSDP wrap (one forward, one backward per micro-batch). The frozen target parts it reads
(embeddings, lm_head) are held outside the module tree, so they are neither trained, sharded nor saved.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from serve.drafters.base import FINAL
from serve.drafters.masks import additive, ttt_allowed
from serve.drafters.vocab import draft_token_ids
from train import losses


@dataclass
class FeatureBatch:
    """A padded batch (right padding; padded rows have loss_mask 0)."""
    input_ids: torch.Tensor                       # (B, T) long
    loss_mask: torch.Tensor                       # (B, T) 0/1
    hidden_states: dict[int, torch.Tensor]        # layer id -> (B, T, h)
    attention_mask: torch.Tensor | None = None    # (B, T) 1 on real tokens

    def to(self, device, dtype=None) -> "FeatureBatch":
        return FeatureBatch(self.input_ids.to(device), self.loss_mask.to(device),
                            {k: v.to(device=device, dtype=dtype or v.dtype) for k, v in self.hidden_states.items()},
                            None if self.attention_mask is None else self.attention_mask.to(device))

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.numel())


@dataclass
class TargetParts:
    """The frozen pieces of the target a head trains against."""
    embed: nn.Module                # input embeddings (Gemma's scaled embedding included)
    lm_head_weight: torch.Tensor    # (V, h)

    @classmethod
    def of(cls, target) -> "TargetParts":
        return cls(embed=target.model.get_input_embeddings(),
                   lm_head_weight=target.model.get_output_embeddings().weight)

    def logits(self, final: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """final: (B, T, h) -> target logits (B, T, V), or (B, T, len(rows)) over the given vocabulary rows."""
        weight = self.lm_head_weight if rows is None else self.lm_head_weight[rows]
        return F.linear(final.to(weight.dtype), weight).float()


class Objective(nn.Module):
    method: str

    def __init__(self, head: nn.Module, parts: TargetParts):
        super().__init__()
        self.head = head
        object.__setattr__(self, "parts", parts)  # frozen, not a submodule

    def term_weights(self) -> dict[str, float]:
        raise NotImplementedError

    def term_counts(self, batch: FeatureBatch) -> dict[str, torch.Tensor]:
        """Loss rows per term: a function of the data alone, summed over processes before the loss is formed."""
        raise NotImplementedError


def _positions(batch_size: int, seq_len: int, offset: int, device) -> torch.Tensor:
    return (torch.arange(seq_len, device=device) + offset).expand(batch_size, seq_len)


class EagleObjective(Objective):
    """EAGLE-1 (feature SmoothL1 + 0.1 x soft CE, feature noise) and EAGLE-3 (training-time test, soft CE
    over the draft vocabulary, step weights decay^j). Unrolled steps attend like drafting does (ttt_allowed)."""

    def __init__(self, head, parts, *, ttt_steps: int = 7, decay: float = 0.8, feature_noise: float = 0.1,
                 feature_weight: float = 1.0, ce_weight: float = 0.1):
        super().__init__(head, parts)
        self.method = head.config.method
        self.steps = ttt_steps if self.method == "eagle3" else 1
        self.decay, self.feature_noise = decay, feature_noise
        self.feature_weight, self.ce_weight = feature_weight, ce_weight

    # ------------------------------------------------------------------------------------- bookkeeping
    def term_weights(self) -> dict[str, float]:
        if self.method == "eagle1":
            return {"feature": self.feature_weight, "ce": self.ce_weight}
        return {f"ttt{j}": w for j, w in enumerate(losses.step_weights(self.steps, self.decay))}

    def _row_masks(self, loss_mask: torch.Tensor, final: torch.Tensor | None, steps: int) -> list[torch.Tensor]:
        masks = [losses.row_mask(loss_mask, j) for j in range(steps)]
        if self.method == "eagle3" and self.head.config.uses_draft_vocab and final is not None:
            # rows whose target top-1 lies outside the draft vocabulary cannot be matched (as SpecForge)
            inside = self._inside_draft_vocab(final)
            masks = [m * losses.shift_left(inside, 1 + j, fill=0.0) for j, m in enumerate(masks)]
        return masks

    def _inside_draft_vocab(self, final: torch.Tensor) -> torch.Tensor:
        """(B, T) 1.0 where the target's top-1 is in the draft vocabulary; the full-vocabulary logits are
        computed once per batch (term_counts and forward both ask)."""
        cached = getattr(self, "_inside_cache", None)
        if cached is not None and cached[0] is final:
            return cached[1]
        with torch.no_grad():
            inside = self.head.t2d[self.parts.logits(final).argmax(-1)].float()
        object.__setattr__(self, "_inside_cache", (final, inside))  # holds `final`, so identity is safe
        return inside

    def term_counts(self, batch: FeatureBatch) -> dict[str, torch.Tensor]:
        masks = self._row_masks(batch.loss_mask, batch.hidden_states[FINAL], self.steps)
        if self.method == "eagle1":
            return {"feature": masks[0].sum(), "ce": masks[0].sum()}
        return {f"ttt{j}": m.sum() for j, m in enumerate(masks)}

    # --------------------------------------------------------------------------------------- the unroll
    def _noise(self, hidden: torch.Tensor, noise_seeds: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Per-row noise from per-row seeds over the real length only: independent of padding and of how
        rows are spread over processes, so 1 and N processes see the same noise."""
        noise = torch.zeros_like(hidden)
        for b, (seed, n) in enumerate(zip(noise_seeds.tolist(), lengths.tolist())):
            gen = torch.Generator().manual_seed(int(seed))
            noise[b, :n] = losses.uniform_noise((n, hidden.shape[-1]), half_width=self.feature_noise, generator=gen,
                                                device=hidden.device, dtype=hidden.dtype)
        return hidden + noise

    def _unroll(self, input_ids, hidden_states, steps: int, noise_seeds=None, lengths=None):
        """Yield (step j, head output (B, T, h)) for j = 0..steps-1; row t of step j reads token x_{t+1+j}."""
        head = self.head
        param = next(head.parameters())
        hidden = head.input_hidden({k: v.to(param.dtype) for k, v in hidden_states.items()})  # (B, T, h)
        if self.method == "eagle1" and noise_seeds is not None and self.feature_noise > 0:
            hidden = self._noise(hidden, noise_seeds, lengths)
        from transformers import DynamicCache

        cache = DynamicCache()
        B, T = input_ids.shape
        for j in range(steps):
            tokens = losses.shift_left(input_ids, 1 + j, fill=0)  # (B, T)
            embeds = self.parts.embed(tokens).to(param.dtype)
            mask = additive(ttt_allowed(T, j, device=input_ids.device), param.dtype)[None]  # (1, 1, T, (j+1)T)
            out = head(hidden, embeds, position_ids=_positions(B, T, j, input_ids.device), attention_mask=mask,
                       cache=cache)
            yield j, out
            hidden = out  # the next step drafts from the head's own output

    def _draft_logits(self, out: torch.Tensor) -> torch.Tensor:
        if self.method == "eagle1":
            return self.parts.logits(out)
        return self.head.logits(out).float()

    def forward(self, input_ids, loss_mask, hidden_states: dict[int, torch.Tensor], attention_mask=None,
                noise_seeds=None):
        """Loss sums per term (see term_weights). noise_seeds: (B,) per-row seeds of EAGLE-1's feature noise."""
        final = hidden_states[FINAL]
        masks = self._row_masks(loss_mask, final, self.steps)
        sums = {}
        if self.method == "eagle1":
            target_logits = self.parts.logits(final)  # (B, T, V)
            lengths = attention_mask.sum(1) if attention_mask is not None else None
            for _, out in self._unroll(input_ids, hidden_states, 1, noise_seeds, lengths):
                sums["feature"] = losses.feature_smooth_l1(out, losses.shift_left(final, 1), masks[0])
                sums["ce"] = losses.soft_cross_entropy(self.parts.logits(out), losses.shift_left(target_logits, 1),
                                                       masks[0])
            return sums
        rows = draft_token_ids(self.head.d2t)
        target_logits = self.parts.logits(final, rows)  # (B, T, Vd): the target restricted to the draft vocab
        for j, out in self._unroll(input_ids, hidden_states, self.steps):
            sums[f"ttt{j}"] = losses.soft_cross_entropy(self.head.logits(out),
                                                        losses.shift_left(target_logits, 1 + j), masks[j])
        return sums

    @torch.no_grad()
    def agreement(self, batch: FeatureBatch, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(hits, rows) per drafted position 1..steps: draft top-1 (own features) == target top-1."""
        final = batch.hidden_states[FINAL]
        target_top1 = self.parts.logits(final).argmax(-1)  # (B, T)
        masks = [losses.row_mask(batch.loss_mask, j) for j in range(steps)]
        hits, rows = torch.zeros(steps), torch.zeros(steps)
        for j, out in self._unroll(batch.input_ids, batch.hidden_states, steps):
            draft = self._draft_logits(out).argmax(-1)
            if self.method == "eagle3":
                draft = draft + self.head.d2t[draft]
            h, r = losses.top1_hits(draft, losses.shift_left(target_top1, 1 + j, fill=-1), masks[j])
            hits[j], rows[j] = float(h), float(r)
        return hits, rows


class MedusaObjective(Objective):
    """Medusa-1: head i, CE against the data token x_{t+i+2} (the target's own, self-distilled), weight decay^i."""

    method = "medusa"

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
                noise_seeds=None):
        param = next(self.head.parameters())
        logits = self.head(hidden_states[FINAL].to(param.dtype))  # (n, B, T, Vd)
        return {f"head{i}": losses.hard_cross_entropy(logits[i], labels, mask)
                for i, (labels, mask) in enumerate(self._labels_and_masks(input_ids, loss_mask))}

    @torch.no_grad()
    def agreement(self, batch: FeatureBatch, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
        final = batch.hidden_states[FINAL]
        target_top1 = self.parts.logits(final).argmax(-1)  # (B, T)
        param = next(self.head.parameters())
        logits = self.head(final.to(param.dtype))
        n = min(steps, self.head.num_heads)
        hits, rows = torch.zeros(n), torch.zeros(n)
        for i in range(n):
            draft = logits[i].argmax(-1)
            draft = draft + self.head.d2t[draft]
            h, r = losses.top1_hits(draft, losses.shift_left(target_top1, 1 + i, fill=-1),
                                    losses.row_mask(batch.loss_mask, i))
            hits[i], rows[i] = float(h), float(r)
        return hits, rows


def build_objective(head, parts: TargetParts, *, ttt_steps: int, decay: float, feature_noise: float,
                    feature_weight: float, ce_weight: float) -> Objective:
    if head.config.method == "medusa":
        return MedusaObjective(head, parts, decay=decay)
    return EagleObjective(head, parts, ttt_steps=ttt_steps, decay=decay, feature_noise=feature_noise,
                          feature_weight=feature_weight, ce_weight=ce_weight)
