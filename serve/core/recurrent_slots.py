"""The recurrent half of the batched decoder's slot cache: per slot row, the convolution and recurrent states of a
hybrid target's linear-attention, Mamba and short-convolution layers (Qwen3.5, Qwen3-Next, Nemotron-H, Granite-4
hybrid, Falcon-H1, LFM2, OLMo-hybrid).

Those layers speak to their cache through transformers' linear-attention calls (`get_conv_state`,
`update_conv_state`, `get_recurrent_state`, `update_recurrent_state`, `get_recurrent_states_to_keep`,
`is_recording_past`); serve/core/slots.py SlotCache forwards them here. Two kinds of forward:

- a prefill of one newcomer (rows of a hybrid target are prefilled alone: left padding would run through the
  recurrence), whose final states go to its slot row;
- a cycle over rows [0, active), each with its pending token and drafts, right-padded to one width W. The layers are
  asked to record the state after every one of the W tokens; `keep(row, n)` then sets the row's states to those
  after its own n kept tokens, so padding and rejected drafts leave no trace and rows accept different counts.
"""
from __future__ import annotations

import torch

KEEP_ALL = 1 << 30  # recurrent states to record in a cycle: every token of it (the layer caps it at its width)


class RecurrentSlots:
    """conv[layer][state]: (slots, channels, kernel); rec[layer][state]: (slots, ...), allocated on first use."""

    def __init__(self, slots: int):
        self.slots = slots
        self.conv: dict[tuple[int, int], torch.Tensor] = {}
        self.rec: dict[tuple[int, int], torch.Tensor] = {}
        self._mode: tuple = ()
        self._full_conv: dict[tuple[int, int], torch.Tensor] = {}  # this cycle's (A, C, K + W) conv inputs
        self._history: dict[tuple[int, int], list[torch.Tensor]] = {}  # this cycle's states after each token

    # ---- what the next forward is -------------------------------------------------------------------------
    def plan_prefill(self, row: int) -> None:
        self._mode = ("prefill", row)

    def plan_cycle(self, active: int) -> None:
        self._mode = ("cycle", active)
        self._full_conv.clear()
        self._history.clear()

    # ---- the layers' calls --------------------------------------------------------------------------------
    def is_recording_past(self, layer_idx: int | None = None) -> bool:
        return self._mode[0] == "cycle"  # a cycle's single-token rows take the recorded path too

    def get_recurrent_states_to_keep(self, layer_idx: int | None = None) -> int:
        return KEEP_ALL if self._mode[0] == "cycle" else 0

    def increase_count(self, layer_idx: int, state_idx: int = 0) -> None:
        """The count transformers keeps per layer; positions are passed explicitly here."""

    def get_conv_state(self, layer_idx: int, state_idx: int = 0) -> torch.Tensor | None:
        if self._mode[0] != "cycle" or (layer_idx, state_idx) not in self.conv:
            return None  # a prefill starts from nothing
        return self.conv[layer_idx, state_idx][: self._mode[1]]

    def get_recurrent_state(self, layer_idx: int, state_idx: int = 0) -> torch.Tensor | None:
        if self._mode[0] != "cycle" or (layer_idx, state_idx) not in self.rec:
            return None
        return self.rec[layer_idx, state_idx][: self._mode[1]].clone()  # the kernels may write their initial state

    def update_conv_state(self, conv_states: torch.Tensor, layer_idx: int, state_idx: int = 0, *,
                          conv_kernel_size: int | None = None, **kwargs) -> torch.Tensor:
        """conv_states: (B, C, T) the layer's new inputs -> what its causal convolution runs over."""
        key = (layer_idx, state_idx)
        if self._mode[0] == "prefill":
            kernel = conv_kernel_size or conv_states.shape[-1]
            if key not in self.conv:
                self.conv[key] = conv_states.new_zeros((self.slots, conv_states.shape[1], kernel))
            padded = torch.nn.functional.pad(conv_states, (max(0, kernel - conv_states.shape[-1]), 0))
            self.conv[key][self._mode[1]] = padded[0, :, -kernel:]
            return padded
        full = torch.cat([self.conv[key][: self._mode[1]], conv_states], dim=-1)  # (A, C, K + W)
        self._full_conv[key] = full
        return full

    def update_recurrent_state(self, recurrent_states: torch.Tensor | list[torch.Tensor], layer_idx: int,
                               state_idx: int = 0, **kwargs) -> torch.Tensor:
        """recurrent_states: the state after the forward, or (recording) the states after each of its tokens."""
        key = (layer_idx, state_idx)
        states = [recurrent_states] if isinstance(recurrent_states, torch.Tensor) else list(recurrent_states)
        if self._mode[0] == "prefill":
            last = states[-1]
            if key not in self.rec:
                self.rec[key] = last.new_zeros((self.slots, *last.shape[1:]))
            self.rec[key][self._mode[1]] = last[0]
            return last
        self._history[key] = states
        return states[-1]

    # ---- after a cycle, between requests ------------------------------------------------------------------
    def keep(self, row: int, kept: int) -> None:
        """Row `row` of the last cycle keeps its first `kept` tokens: its states become those after them."""
        for key, full in self._full_conv.items():
            kernel = self.conv[key].shape[-1]
            self.conv[key][row] = full[row, :, kept: kept + kernel]
        for key, states in self._history.items():
            if len(states) < kept:
                raise RuntimeError(f"layer {key[0]} recorded {len(states)} states, {kept} tokens kept")
            self.rec[key][row] = states[kept - 1][row]

    def move_row(self, src: int, dst: int) -> None:
        for store in (self.conv, self.rec):
            for buffer in store.values():
                buffer[dst] = buffer[src]
