"""An MTP step of several of the family's blocks (Nemotron-H): which layer configs have one, and the module that runs
it (head.py builds it where the layer config names its blocks)."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.core.kv import cache_argument

# the config key of a family whose MTP step is several of its blocks, of these types in order (Nemotron-H)
STEP_BLOCKS = "mtp_layers_block_type"


def step_blocks(config: Any) -> int:
    """How many of the family's blocks one MTP step of a layer config is, when several (STEP_BLOCKS); 0: one decoder
    layer, mtp_block itself."""
    return len(getattr(config, STEP_BLOCKS, None) or ())


class MtpBlocks(nn.ModuleList):
    """One MTP step of several of the family's blocks (Nemotron-H: its layer config's layers, of the types
    STEP_BLOCKS names), run in order, each with its own pre-norm and residual, as vLLM's nemotron_h_mtp.py runs them
    (its residual carried between blocks and added before the end norm is the same sum). The one attention block
    keeps the head's cache layer 0, as a one-layer head does (the drafters read that layer)."""

    def __init__(self, config: Any, layer_cls: type):
        super().__init__([layer_cls(config, i) for i in range(config.num_hidden_layers)])
        attention = [block for block in self if hasattr(getattr(block, "mixer", None), "k_proj")]
        if len(attention) != 1:
            raise DraftsmithError(f"draftsmith's MTP drafter keeps one attention cache: an MTP step of the blocks "
                                  f"{getattr(config, STEP_BLOCKS)} has {len(attention)} attention blocks")
        attention[0].mixer.layer_idx = 0

    def forward(self, hidden_states: torch.Tensor, *, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, cache: Any = None, **kwargs) -> torch.Tensor:
        for block in self:
            out = block(hidden_states, attention_mask=attention_mask, position_ids=position_ids,
                        **cache_argument(block, cache), **kwargs)
            hidden_states = out[0] if isinstance(out, tuple) else out
        return hidden_states
