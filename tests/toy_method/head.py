"""The toy head (Linear(h, V) over the final feature) and the drafter that proposes its one greedy token a cycle."""
from __future__ import annotations

import torch
from torch import nn

from draftsmith.serve.core.layers import FINAL
from draftsmith.serve.core.target import text_config
from draftsmith.serve.drafters.base import Draft, Drafter
from draftsmith.serve.drafters.head_config import HeadConfig
from draftsmith.serve.drafters.identity import check_target_identity


def toy_config(target) -> HeadConfig:
    text = text_config(target.config)
    return HeadConfig(method="toy", model_type=text.model_type, hidden_size=text.hidden_size,
                      vocab_size=text.vocab_size, draft_vocab_size=text.vocab_size, num_speculative_tokens=1,
                      aux_layer_ids=[FINAL], target_model_type=text.model_type, target_name=target.name,
                      target_config_hash=target.config_hash, target_tokenizer_hash=target.tokenizer_hash)


class ToyHead(nn.Module):
    def __init__(self, config: HeadConfig):
        super().__init__()
        self.config = config
        self.proj = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    def forward(self, final: torch.Tensor) -> torch.Tensor:
        """(..., h) -> (..., V): the token two places after the feature's position."""
        return self.proj(final)


class ToyDrafter(Drafter):
    kind = "toy"
    target_layers = (FINAL,)

    def __init__(self, head: ToyHead, target, *, check: bool = True, policy=None, leaves: int = 0):
        self.head = head.eval().requires_grad_(False)
        self.policy = policy
        if check:
            check_target_identity(head.config, target)
        self._last: torch.Tensor | None = None  # (h,) the final feature before the pending token

    def begin(self, prompt_ids, next_tokens, hidden_states) -> None:
        self._last = hidden_states[FINAL][-1]

    def commit(self, next_tokens, hidden_states) -> None:
        self._last = hidden_states[FINAL][-1]

    def propose(self, k: int, *, temperature: float = 0.0, generator=None, tree=None) -> Draft:
        weight = self.head.proj.weight
        with torch.no_grad():
            token = self.head(self._last.to(device=weight.device, dtype=weight.dtype)).argmax(-1)
        return Draft(tokens=token.reshape(1).cpu())  # deterministic: verified with a one-hot q
