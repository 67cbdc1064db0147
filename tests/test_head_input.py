"""The lm_head reads a prefill's last position in standard strides (serve/core/head_input.py): the same logits,
without torch's batched matmul over a copy of the weight per row."""
from __future__ import annotations

import torch

from draftsmith.serve.core.head_input import _strides, standard_head_input


def test_a_sliced_last_position_reaches_the_head_in_standard_strides():
    head = torch.nn.Linear(8, 50, bias=False)
    seen = []
    head.register_forward_hook(lambda module, args, out: seen.append(args[0].stride()))
    hidden = torch.randn(3, 7, 8)
    expected = head(hidden[:, -1:, :].clone())
    standard_head_input(type("M", (), {"get_output_embeddings": lambda self: head})())
    got = head(hidden[:, -1:, :])  # stride (56, 8, 1): transformers' logits_to_keep=1
    assert seen[-1] == _strides((3, 1, 8)) == (8, 8, 1) and torch.equal(got, expected)
    head(hidden)  # already standard: passed as it is
    assert seen[-1] == hidden.stride()
    standard_head_input(type("M", (), {"get_output_embeddings": lambda self: head})())  # once per head
    assert len(head._forward_pre_hooks) == 1


def test_every_loaded_target_has_it(tiny_target):
    head = tiny_target.model.get_output_embeddings()
    assert getattr(head, "_draftsmith_standard_input", False) and len(head._forward_pre_hooks) >= 1
