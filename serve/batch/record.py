"""What the batched decoder keeps of its own forwards for offline training (`data build --capture`): the hidden
states of every token a row's forwards read, at the layers a drafter trains from, and the target's argmax after
each token, as a separate capture (data/capture.py) would store them.

A row's forwards read its prompt (the prefill) and then each token it wrote, one a step; the last token it wrote is
read by one more step of its own (the row's closing step, serve/batch/decoder.py), so the states cover the whole
row: prompt + answer, T tokens.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from draftsmith.serve.core.layers import FINAL
from draftsmith.serve.core.sampling import greedy_tokens


@dataclass(frozen=True)
class Recording:
    """What to keep: the states at `layers` (ids of serve/core/layers.py; FINAL among them) in `dtype`."""
    layers: tuple[int, ...]
    dtype: torch.dtype

    def __post_init__(self):
        if FINAL not in self.layers:  # the argmax after each token is read from the final state
            object.__setattr__(self, "layers", (*self.layers, FINAL))


@dataclass
class RowRecord:
    """One row's states, in the chunks its forwards produced them."""
    states: list[torch.Tensor] = field(default_factory=list)  # chunks (T_i, L, h)
    top1: list[torch.Tensor] = field(default_factory=list)  # chunks (T_i,) long

    def add(self, states: torch.Tensor, top1: torch.Tensor) -> None:
        self.states.append(states)
        self.top1.append(top1)

    @property
    def tokens(self) -> int:
        return sum(chunk.shape[0] for chunk in self.top1)

    def take(self, layers: Sequence[int], length: int) -> "Recorded | None":
        """The first `length` tokens' states; None when the forwards read fewer (the row could not close)."""
        if self.tokens < length:
            return None
        states = torch.cat(self.states)[:length]  # (T, L, h)
        return Recorded(states={layer: states[:, i] for i, layer in enumerate(layers)},
                        top1=torch.cat(self.top1)[:length])


@dataclass
class Recorded:
    """A finished row's states: {layer id: (T, h)} and the target's argmax after each token (T,)."""
    states: dict[int, torch.Tensor]
    top1: torch.Tensor


def stacked(hidden: dict[int, torch.Tensor], layers: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """{layer id: (B, T, h)} -> (B, T, L, h) in `dtype`, the layers in `layers`' order."""
    return torch.stack([hidden[layer] for layer in layers], dim=2).to(dtype)


@torch.inference_mode()
def target_argmax(lm_head: torch.nn.Module, final: torch.Tensor, *, chunk: int = 1024) -> torch.Tensor:
    """(T, h) final normed states -> (T,) the target's top-1 after each position, in the compute dtype (stored
    once, so training never runs the full-vocabulary lm_head again). Chunked: (chunk, V) logits. The argmax as
    greedy decoding takes it (`greedy_tokens`: the first on a tie, as `argmax`; over a prompt's bf16 logits in a
    quarter of `argmax`'s time)."""
    return torch.cat([greedy_tokens(lm_head(final[s:s + chunk])) for s in range(0, final.shape[0], chunk)])
