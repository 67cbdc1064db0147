"""An MTP layer with experts, run in bfloat16, keeps its router's gate and score bias in float32 (transformers'
`_keep_in_fp32_modules_strict`, as transformers loads the target and vLLM builds its MTP layers), so it routes the
way the engines do; everything else follows the target's dtype, and greedy decoding stays exact."""
from __future__ import annotations

import pytest
import torch

from draftsmith.serve.core.target import load_target
from draftsmith.serve.decoding import plain_generate, speculative_generate
from draftsmith.serve.drafters import build_drafter
from draftsmith.serve.methods.mtp.from_target import shipped_head
from draftsmith.serve.methods.mtp.head import float32_names
from tests.mtp_fixtures import save_mtp_target


@pytest.mark.parametrize("family", ["deepseek_v3", "nemotron_h"])
def test_the_router_stays_float32_and_exact_in_a_bfloat16_head(tmp_path, family):
    folder = save_mtp_target(tmp_path / family, family)
    reference = shipped_head(load_target(folder), cast=False)  # float32, as the checkpoint holds it
    target = load_target(folder, dtype="bfloat16")
    head = shipped_head(target)
    tensors = dict([*head.named_parameters(), *head.named_buffers()])
    stored = dict([*reference.named_parameters(), *reference.named_buffers()])
    kept = float32_names(head, head.fp32)
    assert kept and all(name.endswith(("gate.weight", "gate.e_score_correction_bias")) for name in kept)
    for name, tensor in tensors.items():
        if not tensor.is_floating_point():
            continue
        if name in kept:
            assert tensor.dtype == torch.float32 and torch.equal(tensor, stored[name]), name
        else:
            assert tensor.dtype == torch.bfloat16, name
    prompt = torch.tensor([[5, 9, 14, 3, 5, 9, 14, 3, 5, 9]])
    plain = plain_generate(target, prompt, max_new_tokens=12)
    spec = speculative_generate(target, build_drafter("mtp", target), prompt, max_new_tokens=12, k=3)
    assert spec.output_ids == plain.output_ids


def test_a_float32_head_is_cast_whole(tmp_path):
    head = shipped_head(load_target(save_mtp_target(tmp_path / "t", "deepseek_v3")), cast=False)
    head.to(torch.float64)  # only half precision keeps the router apart
    assert {t.dtype for t in head.parameters()} == {torch.float64}
