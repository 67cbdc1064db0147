"""The native drafter config (config.json of a drafter folder): everything needed to rebuild a head without its
target, and how it drafts unless told otherwise."""
from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Optional

from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.core.layers import CONVENTION
from draftsmith.serve.core.ranges import check_ranges

FORMAT_KEY = "draftsmith_drafter"  # the config.json key that marks a native drafter folder (value: format version)
# 2: every EAGLE head's layer is a Llama layer (serve/drafters/draft_layer.py); 1: the target family's layer
# (serve/drafters/legacy.py reads those folders)
FORMAT_VERSION = 2


@dataclass
class HeadConfig:
    """Everything needed to rebuild a head without its target; saved as the drafter folder's config.json."""
    RANGES: ClassVar[dict[str, str]] = {"hidden_size": ">= 1", "vocab_size": ">= 1", "draft_vocab_size": ">= 1",
                                        "num_speculative_tokens": ">= 1", "aux_layer_ids": ">= -1",  # -1: FINAL
                                        "medusa_num_layers": ">= 1", "ttt_steps": ">= 1", "min_confidence": "[0, 1)",
                                        "block_size": ">= 0", "mask_token_id": ">= -1",
                                        "draftsmith_drafter": ">= 1"}
    method: str
    model_type: str                      # EAGLE: the draft layer's ("llama"); Medusa: the target's
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
    norm_output: bool = False            # EAGLE-3: the next step reads the normed output (EAGLE-3.1)
    fc_bias: bool = False                # EAGLE-1 fc bias
    medusa_num_layers: int = 1           # ResBlocks per Medusa head
    ttt_steps: int = 1                   # EAGLE-3 training-time-test unroll it was trained with
    block_size: int = 0                  # DFlash: tokens per block (the last verified one, then block_size-1 masks)
    mask_token_id: int = -1              # DFlash: the token id whose embedding fills a block's drafted slots
    # How it drafts unless told otherwise (serve/drafters/settings.py): K above, these two, a flag overrides.
    tree: Optional[dict] = None          # null = chains; {depth, top_k, total_tokens} or {static_choices} = trees
    min_confidence: float = 0.0          # chains stop where the draft's top-1 probability falls below it
    layer_config: dict = field(default_factory=dict)  # HF (Llama) config of the drafter's decoder layer
    target_model_type: str = ""          # the target's family (its text config's model_type)
    target_name: str = ""
    target_config_hash: str = ""
    target_tokenizer_hash: str = ""
    draftsmith_drafter: int = FORMAT_VERSION

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict, *, source: str | Path = "drafter config") -> "HeadConfig":
        """The config `data` describes; DraftsmithError naming the field when one is unknown, missing, of another
        type or out of its range (`source`: where it was read, for the message)."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - set(fields))
        if unknown:
            raise DraftsmithError(f"{source} has unknown fields {unknown}; written by a newer draftsmith?")
        missing = sorted(name for name, f in fields.items() if name not in data and
                         f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
        if missing:
            raise DraftsmithError(f"{source} lacks {missing}: the drafter folder is damaged; copy or train it again")
        hints = typing.get_type_hints(cls)
        for name, value in data.items():
            if not _is_a(value, hints[name]):
                raise DraftsmithError(f"{source}: {name}={value!r} is not of type {_type_name(hints[name])}: the "
                                      f"drafter folder is damaged; copy or train it again")
        from draftsmith.serve.methods.registry import method

        method(data["method"], what=f"{source}: drafter method", trained=True)  # a folder of a method not installed: refused
        config = cls(**data)
        check_ranges(config, prefix=f"{source}: ")
        return config

    @property
    def uses_draft_vocab(self) -> bool:
        return self.draft_vocab_size != self.vocab_size


def _is_a(value: Any, annotation: Any) -> bool:
    """isinstance for the JSON types HeadConfig's fields hold: int, float, bool, str, list[int], dict, Optional."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Union:
        return any(_is_a(value, a) for a in args)
    if annotation is type(None):
        return value is None
    if origin is list:
        return isinstance(value, list) and all(_is_a(v, args[0]) for v in value)
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, origin or annotation)


def _type_name(annotation: Any) -> str:
    return str(annotation).replace("typing.", "") if typing.get_args(annotation) else annotation.__name__
