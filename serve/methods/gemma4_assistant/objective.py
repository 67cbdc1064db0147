"""The Gemma 4 assistant's training objective: at every position t at once, the assistant reads what it reads when it
drafts there and drafts x_{t+2}, x_{t+3}, ... from one constant position, as SinglePositionMultiTokenCandidateGenerator
drives it (drafter.py):

    step 0:  cat(target.embed(x_{t+1}), h_t)          h_t the target's final normed state at t
    step j:  cat(target.embed(x_{t+1+j}), s_{j-1})    s the assistant's post_projection of its previous step
    every step at position t+1, attending to the target's keys and values of its store layers at positions <= t (the
    sliding layer's last sliding_window - 1 of them): one masked attention over the whole row, not a loop over t

and is trained against the target's distribution there (soft CE or an acceptance loss, losses.distribution_loss),
step weights decay^j, through its lm_head over the whole vocabulary (an assistant with ordered embeddings drafts from
its top centroids' tokens only: their choice passes no gradient and stays as shipped). The keys and values come
from the same target forward as the hidden states (`target_forward`: transformers' `return_shared_kv_states`), so
training needs the target online.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from draftsmith.serve.core.invariant import suspended
from draftsmith.serve.core.layers import FINAL, pick_hidden_states
from draftsmith.serve.drafters.masks import additive
from draftsmith.serve.methods import losses
from draftsmith.serve.methods.gemma4_assistant.drafter import LAYER_TYPES
from draftsmith.serve.methods.objective import FeatureBatch, Objective, ObjectiveSettings


def kv_name(kind: str, part: str) -> str:
    """The FeatureBatch key of the target's keys or values (`part`) of its store layer of type `kind`."""
    return f"shared_kv.{kind}.{part}"


@torch.no_grad()
def target_forward(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, layers) -> dict:
    """One forward of the frozen target: its hidden states at `layers` (B, T, h) and the keys and values of its
    store layers (B, kv_heads, T, head_dim), under kv_name."""
    decoder = model.get_decoder()
    with suspended(model):  # features decide no token (serve/core/invariant.py)
        out = decoder(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True, use_cache=False,
                      return_shared_kv_states=True)
    features = pick_hidden_states(out.hidden_states, layers)
    for kind in LAYER_TYPES:
        keys, values = out.shared_kv_states[kind]
        features[kv_name(kind, "keys")], features[kv_name(kind, "values")] = keys, values
    return features


def prefix_masks(seq_len: int, window: int, *, dtype: torch.dtype, device=None) -> dict[str, torch.Tensor]:
    """{layer type: (1, 1, T, T) additive}: query t (drafting at position t+1) sees keys 0..t, and of a sliding
    layer only its last window - 1 (keys t-window+2..t), as the decoder's cache holds them when it drafts there."""
    positions = torch.arange(seq_len, device=device)
    seen = positions[None, :] <= positions[:, None]  # (T, T): key s <= query t
    recent = positions[None, :] > positions[:, None] - (window - 1)
    return {"full_attention": additive(seen, dtype)[None], "sliding_attention": additive(seen & recent, dtype)[None]}


class AssistantObjective(Objective):
    target_forward = staticmethod(target_forward)

    def __init__(self, head, parts, *, steps: int, decay: float = 0.8, prompt_weight: float = 0.0, kind: str = "ce",
                 lk_eta: float = 3.0):
        super().__init__(head, parts)
        self.steps, self.decay, self.prompt_weight = steps, decay, prompt_weight
        self.kind, self.lk_eta = kind, lk_eta
        self.window = int(head.config.layer_config["target_sliding_window"])
        self.softcap = head.config.layer_config.get("target_logit_softcapping")

    def term_weights(self) -> dict[str, float]:
        return {f"step{j}": w for j, w in enumerate(losses.step_weights(self.steps, self.decay))}

    def _masks(self, loss_mask, attention_mask) -> list[torch.Tensor]:
        weights = losses.position_weights(loss_mask, attention_mask, self.prompt_weight)
        return [losses.shift_left(weights, 2 + j, fill=0.0) for j in range(self.steps)]  # row t predicts x_{t+2+j}

    def term_counts(self, batch: FeatureBatch) -> dict[str, torch.Tensor]:
        return {f"step{j}": m.sum() for j, m in enumerate(self._masks(batch.loss_mask, batch.attention_mask))}

    def _teacher_logits(self, final: torch.Tensor) -> torch.Tensor:
        """(B, T, h) -> (B, T, V) the target's logits, soft-capped as the target caps them."""
        logits = self.parts.logits(final)
        return logits if not self.softcap else torch.tanh(logits / self.softcap) * self.softcap

    def _embed(self, tokens: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """(B, T) -> (B, T, H): the target's embedding as its own module computes it (Gemma's sqrt(H) scale)."""
        weight = self.parts.embed.weight
        scale = torch.tensor(weight.shape[-1] ** 0.5, dtype=weight.dtype)
        return (F.embedding(tokens, weight) * scale.to(weight.device)).to(dtype)

    def _unroll(self, input_ids: torch.Tensor, hidden_states: dict, steps: int):
        """Yield the assistant's last normed state (B, T, h) of steps 0..steps-1 at every row."""
        param = next(self.head.parameters())
        B, T = input_ids.shape
        kv = {kind: (hidden_states[kv_name(kind, "keys")].to(param.dtype),
                     hidden_states[kv_name(kind, "values")].to(param.dtype)) for kind in LAYER_TYPES}
        masks = prefix_masks(T, self.window, dtype=param.dtype, device=input_ids.device)
        position_ids = (torch.arange(T, device=input_ids.device) + 1).expand(B, T)  # every step at t + 1
        state = hidden_states[FINAL].to(param.dtype)  # (B, T, H)
        for j in range(steps):
            tokens = losses.shift_left(input_ids, 1 + j, fill=0)  # (B, T): x_{t+1+j}
            inputs_embeds = torch.cat([self._embed(tokens, param.dtype), state], dim=-1)  # (B, T, 2H)
            last, state = self.head(inputs_embeds, position_ids=position_ids, attention_mask=masks,
                                    shared_kv_states=kv)
            yield last

    def forward(self, input_ids, loss_mask, hidden_states: dict, attention_mask=None, noise_seeds=None,
                target_top1=None):
        masks = self._masks(loss_mask, attention_mask)
        target_logits = self._teacher_logits(hidden_states[FINAL])  # (B, T, V)
        sums = {}
        for j, last in enumerate(self._unroll(input_ids, hidden_states, self.steps)):
            teacher = losses.shift_left(target_logits, 1 + j)  # the target's distribution of x_{t+2+j}
            sums[f"step{j}"] = losses.distribution_loss(self.head.logits(last), teacher, masks[j], kind=self.kind,
                                                        eta=self.lk_eta)
        return sums

    def draft_ids(self, batch: FeatureBatch, steps: int) -> list[torch.Tensor]:
        return [self.head.logits(last, as_drafted=True).argmax(-1)
                for last in self._unroll(batch.input_ids, batch.hidden_states, steps)]


def assistant_objective(head, parts, settings: ObjectiveSettings) -> AssistantObjective:
    return AssistantObjective(head, parts, steps=head.config.ttt_steps, decay=settings.decay,
                              prompt_weight=settings.prompt_weight, kind=settings.kind, lk_eta=settings.lk_eta)
