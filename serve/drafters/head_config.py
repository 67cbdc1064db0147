"""The native drafter config (config.json of a drafter folder): everything needed to rebuild a head without its
target, and how it drafts unless told otherwise."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Optional

from serve.errors import DraftsmithError
from serve.layers import CONVENTION

FORMAT_KEY = "draftsmith_drafter"  # the config.json key that marks a native drafter folder (value: format version)
FORMAT_VERSION = 1
METHODS = ("eagle1", "eagle3", "medusa")


@dataclass
class HeadConfig:
    """Everything needed to rebuild a head without its target; saved as the drafter folder's config.json."""
    method: str
    model_type: str
    hidden_size: int
    vocab_size: int                      # the target's vocabulary
    draft_vocab_size: int                # == vocab_size when no reduced vocabulary is used
    num_speculative_tokens: int = 5      # K the head was trained for (Medusa: number of heads)
    aux_layer_ids: list[int] = field(default_factory=list)  # target layers the head reads (our convention)
    layer_convention: str = CONVENTION
    input_layernorm: bool = True         # EAGLE-1: False = the decoder layer's input norm is an identity
    hidden_norm: bool = True             # EAGLE-3: the fused hidden state is normed before attention
    fc_norm: bool = False                # EAGLE-3: an RMSNorm per aux feature before `fc` (EAGLE-3.1)
    norm_before_fc: bool = False         # EAGLE-3: one RMSNorm over the concatenated aux features before `fc`
    fc_bias: bool = False                # EAGLE-1 fc bias
    medusa_num_layers: int = 1           # ResBlocks per Medusa head
    ttt_steps: int = 1                   # EAGLE-3 training-time-test unroll it was trained with
    # How it drafts unless told otherwise (serve/drafters/settings.py): K above, these two, a flag overrides.
    tree: Optional[dict] = None          # null = chains; {depth, top_k, total_tokens} or {static_choices} = trees
    min_confidence: float = 0.0          # chains stop where the draft's top-1 probability falls below it
    layer_config: dict = field(default_factory=dict)  # HF config of the drafter's decoder layer
    target_name: str = ""
    target_config_hash: str = ""
    target_tokenizer_hash: str = ""
    draftsmith_drafter: int = FORMAT_VERSION

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "HeadConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise DraftsmithError(f"drafter config has unknown fields {unknown}; written by a newer draftsmith?")
        return cls(**data)

    @property
    def uses_draft_vocab(self) -> bool:
        return self.draft_vocab_size != self.vocab_size
