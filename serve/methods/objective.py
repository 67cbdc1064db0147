"""What every method's training objective is made of: the batch of target features it reads, the frozen target
parts, the agreement it reports, and the `Objective` protocol: one nn.Module per method that turns a batch into
loss sums, the unit that DDP / DeepSpeed / FSDP wrap (one forward, one backward per micro-batch). The frozen target
parts it reads (embeddings, lm_head) are held outside the module tree, so they are neither trained, sharded nor saved.

Each method's own objective lives in its folder (serve/methods/<name>/objective.py). EAGLE-1 and EAGLE-3 share the
unroll below (`UnrolledObjective`) and say what differs, as transformers' modular files do.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from draftsmith.serve.drafters.draft_layer import SharedEmbedding, shared_embedding
from draftsmith.serve.core.layers import FINAL
from draftsmith.serve.drafters.masks import additive, ttt_allowed
from draftsmith.serve.methods import losses
from draftsmith.serve.core.target import Target


@dataclass(frozen=True)
class ObjectiveSettings:
    """The recipe's loss settings, as each method's objective reads them (train/config.py LossConfig, ModelConfig)."""
    ttt_steps: int = 7              # EAGLE-3: training-time-test unroll
    decay: float = 0.8              # weight decay^i of step / head i
    feature_noise: float = 0.1      # EAGLE-1: U(-a, a) on the input features
    feature_weight: float = 1.0     # EAGLE-1: SmoothL1 on the next feature
    ce_weight: float = 0.1          # EAGLE-1: soft CE through the target's lm_head
    aux_noise: float = 0.0          # EAGLE-3: U(-a, a) x each aux feature's RMS
    prompt_weight: float = 0.0      # soft-target methods: weight of prompt positions
    kind: str = "ce"                # soft-target methods: the loss against the target's distribution (losses.py)
    lk_eta: float = 3.0             # lk_hybrid: lam = exp(-eta * alpha)
    position_weighting: str = "decay"  # decay^i, or dpace: D-PACE's weights from the draft's acceptance (losses.py)
    dpace_smoothing: float = 0.5    # dpace: s = (1 - smoothing) * alpha + smoothing
    anchors: int = 32               # DFlash: blocks per row and step


@dataclass
class FeatureBatch:
    """A padded batch (right padding; padded rows have loss_mask 0)."""
    input_ids: torch.Tensor                       # (B, T) long
    loss_mask: torch.Tensor                       # (B, T) 0/1
    hidden_states: dict[int, torch.Tensor]        # layer id -> (B, T, h); plus what an Objective.target_forward adds
    attention_mask: torch.Tensor | None = None    # (B, T) 1 on real tokens
    target_top1: torch.Tensor | None = None       # (B, T) long: the target's argmax after each position, if cached

    def to(self, device, dtype=None) -> "FeatureBatch":
        return FeatureBatch(self.input_ids.to(device), self.loss_mask.to(device),
                            {k: v.to(device=device, dtype=dtype or v.dtype) for k, v in self.hidden_states.items()},
                            None if self.attention_mask is None else self.attention_mask.to(device),
                            None if self.target_top1 is None else self.target_top1.to(device))

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.numel())


@dataclass
class TargetParts:
    """The frozen pieces of the target a head trains against."""
    embed: SharedEmbedding          # input embeddings as the engines share them with a draft (Gemma: unscaled)
    lm_head_weight: torch.Tensor    # (V, h)

    @classmethod
    def of(cls, target: Target) -> "TargetParts":
        """The target's own tensors; whole copies of them when the target is split over processes (gathered
        once, on every process in the same order: serve/core/sharded_target.full_tensor)."""
        if getattr(target, "sharded", None) is None:
            return cls(embed=shared_embedding(target), lm_head_weight=target.model.get_output_embeddings().weight)
        from types import SimpleNamespace

        from draftsmith.serve.core.sharded_target import full_tensor

        embed = target.model.get_input_embeddings().weight
        head = target.model.get_output_embeddings().weight
        embed_full = full_tensor(embed)
        head_full = embed_full if head is embed else full_tensor(head)
        return cls(embed=SharedEmbedding(SimpleNamespace(weight=embed_full)), lm_head_weight=head_full)

    def logits(self, final: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """final: (B, T, h) -> target logits (B, T, V), or (B, T, len(rows)) over the given vocabulary rows."""
        weight = self.lm_head_weight if rows is None else self.lm_head_weight[rows]
        return F.linear(final.to(weight.dtype), weight).float()

    @torch.no_grad()
    def top1(self, batch: FeatureBatch) -> torch.Tensor:
        """(B, T) the target's argmax after each position: from the cache when it carries it, else recomputed
        through the full lm_head (the most expensive single product of a training step on a large vocabulary)."""
        if batch.target_top1 is not None:
            return batch.target_top1
        return self.logits(batch.hidden_states[FINAL]).argmax(-1)


@dataclass
class Agreement:
    """Held-out (or train) agreement sums, reduced over processes before they are turned into rates.

    hits[j], rows[j]: drafted position j+1 whose top-1 equals the target's, over rows where it is a loss token.
    run_sum / starts: mean number of leading draft positions that all agree, over every loss position a chain
    could start from: at temperature 0 on the target's own greedy text this is the chain's accepted length,
    so 1 + run_sum / starts estimates μ of a K-token chain without running the decoder.
    """
    hits: torch.Tensor     # (K,)
    rows: torch.Tensor     # (K,)
    run_sum: float = 0.0
    starts: float = 0.0

    @classmethod
    def zeros(cls, positions: int) -> "Agreement":
        return cls(torch.zeros(positions), torch.zeros(positions))

    def add(self, other: "Agreement") -> None:
        n = len(other.hits)
        self.hits[:n] += other.hits
        self.rows[:n] += other.rows
        self.run_sum += other.run_sum
        self.starts += other.starts

    def as_tensor(self) -> torch.Tensor:
        return torch.cat([self.hits, self.rows, torch.tensor([self.run_sum, self.starts])])

    @classmethod
    def from_tensor(cls, flat: torch.Tensor) -> "Agreement":
        k = (flat.numel() - 2) // 2
        return cls(flat[:k].clone(), flat[k:2 * k].clone(), float(flat[-2]), float(flat[-1]))

    def summary(self) -> dict:
        rates = (self.hits / self.rows.clamp(min=1)).tolist()
        return {"agreement": [round(a, 5) for a in rates], "eval_rows": int(self.rows[0]),
                "mu_tf": round(1.0 + self.run_sum / max(self.starts, 1.0), 5)}


def agreement_of(draft_ids: list[torch.Tensor], target_top1: torch.Tensor, loss_mask: torch.Tensor) -> Agreement:
    """draft_ids[j]: (B, T) target ids drafted at position j+1 from row t (predicting x_{t+2+j});
    target_top1: (B, T) the target's argmax after each position; loss_mask: (B, T)."""
    k = len(draft_ids)
    out = Agreement.zeros(k)
    runs = torch.zeros_like(target_top1, dtype=torch.float32)  # (B, T) leading agreeing positions per row
    running = torch.ones_like(target_top1, dtype=torch.bool)
    for j, draft in enumerate(draft_ids):
        rows = losses.row_mask(loss_mask, j) > 0
        hit = draft.eq(losses.shift_left(target_top1, 1 + j, fill=-1)) & rows
        out.hits[j], out.rows[j] = float(hit.sum()), float(rows.sum())
        running = running & hit
        runs += running.float()
    starts = losses.row_mask(loss_mask, 0) > 0
    out.run_sum, out.starts = float(runs[starts].sum()), float(starts.sum())
    return out


def _positions(batch_size: int, seq_len: int, offset: int, device) -> torch.Tensor:
    return (torch.arange(seq_len, device=device) + offset).expand(batch_size, seq_len)


class Objective(nn.Module):
    needs_top1 = False  # whether the loss reads the target's argmax (the batch maker fills it in once per batch)
    # what the online batch maker runs the frozen target for. None: its hidden states at the head's layers
    # (train/features.py). An objective that reads more of that same forward (the target's keys and values) gives
    # (model, input_ids, attention_mask, layers) -> {layer id: (B, T, h), and its own named tensors}
    target_forward = None

    def __init__(self, head: nn.Module, parts: TargetParts):
        super().__init__()
        self.head = head
        object.__setattr__(self, "parts", parts)  # frozen, not a submodule

    def term_weights(self) -> dict[str, float]:
        raise NotImplementedError

    def term_counts(self, batch: FeatureBatch) -> dict[str, torch.Tensor]:
        """Loss rows per term: a function of the data alone, summed over processes before the loss is formed."""
        raise NotImplementedError

    def draft_ids(self, batch: FeatureBatch, steps: int) -> list[torch.Tensor]:
        """The head's top-1 (as target ids) at drafted positions 1..steps from every row: [(B, T)] * steps."""
        raise NotImplementedError

    @torch.no_grad()
    def agreement(self, batch: FeatureBatch, steps: int) -> Agreement:
        return agreement_of(self.draft_ids(batch, steps), self.parts.top1(batch), batch.loss_mask)


class UnrolledObjective(Objective):
    """What EAGLE-1 and EAGLE-3 share: the head drafts from the target's features, then from its own outputs;
    unrolled steps attend exactly as drafting does (ttt_allowed). Feature noise (U(-a, a), from per-row seeds
    over the real length, so 1 and N processes see the same noise) regularizes the target features it reads."""

    def __init__(self, head, parts, *, feature_noise: float = 0.0, relative_noise: bool = False,
                 prompt_weight: float = 0.0):
        super().__init__(head, parts)
        self.feature_noise, self.relative_noise = feature_noise, relative_noise
        self.prompt_weight = prompt_weight

    def _loss_weights(self, loss_mask: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """(B, T) weight of the position each row predicts (losses.position_weights)."""
        return losses.position_weights(loss_mask, attention_mask, self.prompt_weight)

    def _noise(self, features: torch.Tensor, noise_seeds: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """features + U(-a, a) (times each row's RMS when relative), seeded per row. (B, T, h) -> (B, T, h)."""
        noise = torch.zeros_like(features)
        for b, (seed, n) in enumerate(zip(noise_seeds.tolist(), lengths.tolist())):
            gen = torch.Generator().manual_seed(int(seed))
            noise[b, :n] = losses.uniform_noise((n, features.shape[-1]), half_width=self.feature_noise,
                                                generator=gen, device=features.device, dtype=features.dtype)
        if self.relative_noise:
            noise = noise * features.float().pow(2).mean(-1, keepdim=True).sqrt().to(features.dtype)
        return features + noise

    def _input_hidden(self, hidden_states, noise_seeds, lengths) -> torch.Tensor:
        """(B, T, h) what the first unroll step reads; noise (training only) on the target features it reads,
        each layer from its own seeds."""
        param = next(self.head.parameters())
        features = {k: hidden_states[k].to(param.dtype) for k in self.head.config.aux_layer_ids}
        if noise_seeds is not None and lengths is not None and self.feature_noise > 0:
            features = {k: self._noise(v, noise_seeds + 7919 * n, lengths) for n, (k, v) in enumerate(features.items())}
        return self.head.input_hidden(features)

    def _unroll(self, input_ids, hidden: torch.Tensor, steps: int):
        """Yield (step j, head output (B, T, h)) for j = 0..steps-1; row t of step j reads token x_{t+1+j}."""
        from draftsmith.serve.core.kv import head_cache

        param = next(self.head.parameters())
        cache = head_cache(self.head)
        B, T = input_ids.shape
        for j in range(steps):
            tokens = losses.shift_left(input_ids, 1 + j, fill=0)  # (B, T)
            embeds = self.parts.embed(tokens).to(param.dtype)
            mask = additive(ttt_allowed(T, j, device=input_ids.device), param.dtype)[None]  # (1, 1, T, (j+1)T)
            out = self.head(hidden, embeds, position_ids=_positions(B, T, j, input_ids.device), attention_mask=mask,
                            cache=cache)
            yield j, out
            hidden = out  # the next step drafts from the head's own output

    def _draft_top1(self, out: torch.Tensor) -> torch.Tensor:
        """(B, T, h) head output -> (B, T) target id of its top-1."""
        raise NotImplementedError

    def draft_ids(self, batch: FeatureBatch, steps: int) -> list[torch.Tensor]:
        hidden = self._input_hidden(batch.hidden_states, None, None)
        return [self._draft_top1(out) for _, out in self._unroll(batch.input_ids, hidden, steps)]
