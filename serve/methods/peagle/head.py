"""P-EAGLE head (arXiv 2602.01469; speculators `peagle`, vLLM `eagle3` with `parallel_drafting`): an EAGLE-3 head
that drafts all K tokens in one forward.

    real pairs   (fused_t, embed(x_{t+1})) at position t, as EAGLE-3: the last one drafts x_{t+2} (depth 0)
    mask slots   (fc(mask_hidden), embed(m)) at positions t+1 .. t+K-1: slot d drafts x_{t+2+d} (depth d)

Every row attends causally (the real context, then the earlier slots of its own block); no drafted token is fed
back, so one forward gives every depth's distribution. `mask_hidden` (n_aux*h,) is a learned stand-in for the aux
features the slots do not have; it goes through the aux-feature norms and fc as real features do (vLLM's
`combine_hidden_states(mask_hidden)`), so it is stored before fc, in the head's aux-layer order.
"""
from __future__ import annotations

import dataclasses

import torch
from torch import nn

from draftsmith.serve.core.target import Target
from draftsmith.serve.drafters.head_config import HeadConfig
from draftsmith.serve.methods.dflash.head import choose_mask_token
from draftsmith.serve.methods.eagle3.head import Eagle3Head, eagle3_config


class PEagleHead(Eagle3Head):
    """EAGLE-3's tensors and mask_hidden (n_aux*h,)."""

    def __init__(self, config: HeadConfig):
        super().__init__(config)
        self.mask_hidden = nn.Parameter(torch.randn(len(config.aux_layer_ids) * config.hidden_size))

    def mask_input(self) -> torch.Tensor:
        """The fused feature every mask slot reads (h,)."""
        chunks = self.mask_hidden.chunk(len(self.config.aux_layer_ids))
        return self.input_hidden(dict(zip(self.config.aux_layer_ids, chunks)))


def peagle_config(target: Target, *, depths: int = 5, mask_token_id: int = -1, **eagle3) -> HeadConfig:
    """An EAGLE-3 config (draft vocabulary, aux layers, norms) drafting `depths` tokens a forward, its slots filled
    with `mask_token_id` (-1: the tokenizer's mask, pad, unk or eos token with a trained row)."""
    config = eagle3_config(target, num_speculative_tokens=depths, ttt_steps=1, **eagle3)
    mask, _ = choose_mask_token(target, mask_token_id)
    return dataclasses.replace(config, method="peagle", mask_token_id=mask)
