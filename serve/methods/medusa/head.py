"""Medusa-1 heads (Cai et al. 2024, https://arxiv.org/abs/2401.10774) and their drafter.

Head i (0-based) reads the target's final normed feature at the last position (whose next token is the
pending one) and predicts the token i+1 places after the pending token:

    blocks.{i}:   x <- x + SiLU(layers.{l}(x)) for each of its own ResBlocks (zero-init linear: starts as identity)
    lm_heads.{i}: (Vd, h), initialized from the target's lm_head (restricted to a draft vocabulary if any)

Every layer of every head is its own module (never `[ResBlock(h)] * L`, which shares one set of weights).
"""
from __future__ import annotations

import torch
from torch import nn

from draftsmith.serve.drafters.base import Draft, Drafter
from draftsmith.serve.drafters.head_config import HeadConfig
from draftsmith.serve.drafters.identity import check_target_identity
from draftsmith.serve.drafters.leaves import MAX_LEAVES, check_leaves
from draftsmith.serve.drafters.length import FixedLength, LastDraft, LengthPolicy, Stopwatch
from draftsmith.serve.drafters.positions_draft import propose_positions
from draftsmith.serve.drafters.vocab import draft_token_ids, identity_vocab
from draftsmith.serve.core.layers import FINAL
from draftsmith.serve.core.target import Target, text_config


class MedusaBlock(nn.Module):
    """A stack of ResBlocks x + SiLU(Linear(x)); `layers.{l}.weight/bias` as vLLM's Medusa names them."""

    def __init__(self, hidden_size: int, num_layers: int):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(hidden_size, hidden_size) for _ in range(num_layers))
        self.act = nn.SiLU()
        for layer in self.layers:
            nn.init.zeros_(layer.weight)  # each block starts as the identity: heads start from the lm_head
            nn.init.zeros_(layer.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = x + self.act(layer(x))
        return x


class MedusaHeads(nn.Module):
    """Stored tensors: blocks.{i}.layers.{l}.weight/bias, lm_heads.{i}.weight (Vd, h); d2t/t2d if Vd < V."""

    def __init__(self, config: HeadConfig):
        super().__init__()
        self.config = config
        h, n = config.hidden_size, config.num_speculative_tokens
        self.blocks = nn.ModuleList(MedusaBlock(h, config.medusa_num_layers) for _ in range(n))
        self.lm_heads = nn.ModuleList(nn.Linear(h, config.draft_vocab_size, bias=False) for _ in range(n))
        d2t, t2d = identity_vocab(config.vocab_size)
        self.register_buffer("d2t", d2t[: config.draft_vocab_size].clone())
        self.register_buffer("t2d", t2d)

    @property
    def num_heads(self) -> int:
        return len(self.blocks)

    def set_vocab(self, d2t: torch.Tensor, t2d: torch.Tensor) -> None:
        self.d2t.copy_(d2t)
        self.t2d.copy_(t2d)

    def init_from_target(self, lm_head_weight: torch.Tensor, d2t: torch.Tensor | None = None,
                         t2d: torch.Tensor | None = None) -> None:
        """Copy the target's lm_head (V, h) into every head, restricted to the draft vocabulary if given."""
        if d2t is not None:
            self.set_vocab(d2t, t2d)
        rows = lm_head_weight[draft_token_ids(self.d2t).to(lm_head_weight.device)]  # (Vd, h)
        with torch.no_grad():
            for head in self.lm_heads:
                head.weight.copy_(rows.to(head.weight.dtype))

    def input_hidden(self, hidden_states: dict[int, torch.Tensor]) -> torch.Tensor:
        return hidden_states[FINAL]

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """(..., h) -> (num_heads, ..., Vd) logits; head i predicts the token i+2 places after the feature's."""
        return torch.stack([lm(block(hidden_states)) for block, lm in zip(self.blocks, self.lm_heads)])


def medusa_config(target: Target, *, num_heads: int = 5, num_layers: int = 1,
                  draft_vocab_size: int | None = None) -> HeadConfig:
    text = text_config(target.config)
    vd = int(draft_vocab_size or text.vocab_size)
    return HeadConfig(method="medusa", model_type=text.model_type, hidden_size=text.hidden_size,
                      vocab_size=text.vocab_size, draft_vocab_size=vd, num_speculative_tokens=num_heads,
                      aux_layer_ids=[FINAL], medusa_num_layers=num_layers, target_model_type=text.model_type,
                      target_name=target.name,
                      target_config_hash=target.config_hash, target_tokenizer_hash=target.tokenizer_hash)


class MedusaDrafter(Drafter):
    """Proposes up to num_heads tokens per cycle from the last feature alone (heads ignore earlier drafts)."""

    kind = "medusa"
    target_layers = (FINAL,)

    def __init__(self, heads: MedusaHeads, target: Target, *, check: bool = True, policy: LengthPolicy | None = None,
                 leaves: int = MAX_LEAVES):
        self.heads = heads.eval().requires_grad_(False)
        self.policy = policy or FixedLength()  # how many heads' tokens each chain drafts
        self.max_leaves = check_leaves(leaves)  # at most this many runner-ups a greedy chain carries
        self.last = LastDraft()  # the last chain proposed, until its verification is known
        self.target = target
        self.vocab_size = heads.config.vocab_size
        if check:
            self.check_target(target)
        self._last_hidden: torch.Tensor | None = None  # (1, h) the target's final feature before the pending token
        self._last_logits: torch.Tensor | None = None

    @property
    def min_confidence(self) -> float:
        return float(getattr(self.policy, "threshold", 0.0))

    def check_target(self, target: Target) -> None:
        check_target_identity(self.heads.config, target)

    def _update(self, hidden_states: dict[int, torch.Tensor]) -> None:
        self._last_hidden = hidden_states[FINAL][-1:]  # (1, h): its next token is the pending one
        self._last_logits = None  # the heads run when a cycle drafts (or the logits are read)

    @property
    def _logits(self) -> torch.Tensor | None:
        """(num_heads, Vd) for the current pending token."""
        if self._last_logits is None and self._last_hidden is not None:
            weight = self.heads.lm_heads[0].weight
            with torch.no_grad():
                self._last_logits = self.heads(self._last_hidden.to(device=weight.device,
                                                                    dtype=weight.dtype))[:, 0].float()
        return self._last_logits

    @classmethod
    def prepare_rows(cls, drafters: list["MedusaDrafter"]) -> None:
        """One forward of the heads for every row whose logits are not computed yet: (n, h) features at once."""
        rows = [d for d in drafters if d._last_logits is None and d._last_hidden is not None]
        if len(rows) < 2:
            return
        heads = rows[0].heads
        weight = heads.lm_heads[0].weight
        features = torch.cat([d._last_hidden for d in rows]).to(device=weight.device, dtype=weight.dtype)  # (n, h)
        with torch.no_grad():
            logits = heads(features).float()  # (num_heads, n, Vd)
        for n, drafter in enumerate(rows):
            drafter._last_logits = logits[:, n]

    def begin(self, prompt_ids, next_tokens, hidden_states) -> None:
        self.last = LastDraft()
        self.policy.new_context()
        self._update(hidden_states)

    def commit(self, next_tokens, hidden_states) -> None:
        self.last.settle(self.policy, next_tokens)
        self._update(hidden_states)

    def _to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.heads.d2t[draft_ids]

    def propose(self, k: int, *, temperature: float = 0.0, generator: torch.Generator | None = None,
                tree=None) -> Draft:
        if not self.last.open(self.policy, always=tree is not None):
            return Draft.empty()
        with Stopwatch(self.policy.record_overhead):  # every head runs once per drafting cycle
            logits = self._logits
        assert logits is not None, "begin() must run before propose()"
        d2t = self.heads.d2t
        return propose_positions(logits, k, policy=self.policy, last=self.last, max_leaves=self.max_leaves,
                                 to_target=lambda draft: self._to_target(draft.to(d2t.device)).cpu(), d2t=d2t,
                                 vocab_size=self.vocab_size, temperature=temperature, generator=generator, tree=tree)
