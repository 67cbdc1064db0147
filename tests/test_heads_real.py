"""The heads on the real default target (SmolLM2-135M, Llama, 30 layers): shapes and lossless drafting."""
from __future__ import annotations

import pytest
import torch

from draftsmith.serve.decoding import plain_generate, speculative_generate
from draftsmith.serve.methods.eagle3.head import eagle3_config
from draftsmith.serve.drafters.folder import build_head, load_drafter, save_drafter
from draftsmith.serve.core.target import load_target
from draftsmith.serve.tree import TreeSpec

pytestmark = pytest.mark.slow


def test_eagle3_head_on_the_default_target(demo_target_dir, tmp_path):
    target = load_target(demo_target_dir)
    cfg = eagle3_config(target, draft_vocab_size=4096)
    assert cfg.aux_layer_ids == [1, 14, 26]
    torch.manual_seed(0)
    head = build_head(cfg)
    state = head.state_dict()
    assert state["fc.weight"].shape == (576, 3 * 576) and state["lm_head.weight"].shape == (4096, 576)
    assert state["midlayer.self_attn.q_proj.weight"].shape == (576, 1152)
    drafter = load_drafter(save_drafter(head, cfg, tmp_path / "eagle3"), target)
    ids = target.tokenizer.apply_chat_template([{"role": "user", "content": "Count to five."}],
                                               add_generation_prompt=True, return_tensors="pt", return_dict=True)
    prompt = ids["input_ids"]
    plain = plain_generate(target, prompt, max_new_tokens=10).output_ids
    assert speculative_generate(target, drafter, prompt, max_new_tokens=10, k=3).output_ids == plain
    tree = TreeSpec(depth=3, top_k=2, total_tokens=6)
    assert speculative_generate(target, drafter, prompt, max_new_tokens=10, k=3, tree=tree).output_ids == plain
