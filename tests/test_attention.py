"""serve/core/attention.py: grouped-query attention without copying the cache on a CPU, with identical logits."""
from __future__ import annotations

import os

import pytest
import torch
from transformers.integrations import sdpa_attention

from draftsmith.serve.core.attention import FORCE_GQA, gqa_wanted, grouped_heads, torch_has_gqa, use_cpu_gqa
from draftsmith.serve.core.kv import cache_kwargs, new_cache, rollback
from draftsmith.serve.core.target import load_target
from tests.tiny_models import tiny_config, tiny_model

pytestmark = pytest.mark.skipif(not torch_has_gqa(), reason="torch's SDPA takes enable_gqa from 2.5 on")


def verify_logits(model, new_tokens: int) -> torch.Tensor:
    """Logits of a forward over `new_tokens` tokens after a 20-token cached context (a verify forward)."""
    ids = (torch.arange(20 + new_tokens) * 37 % 250 + 3)[None]
    cache = new_cache(model)
    with torch.inference_mode():
        model(input_ids=ids[:, :20], **cache_kwargs(model, cache))
        logits = model(input_ids=ids[:, 20:], **cache_kwargs(model, cache)).logits
    rollback(cache, 20)
    return logits


def test_grouped_heads_attend_without_repeating_the_cache_and_give_the_same_logits(monkeypatch):
    model = tiny_model("llama").eval()
    assert grouped_heads(model.config) and gqa_wanted(model)
    calls = []
    original = sdpa_attention.repeat_kv
    monkeypatch.setattr(sdpa_attention, "repeat_kv", lambda *a: calls.append(1) or original(*a))
    monkeypatch.setenv(FORCE_GQA, "0")
    copied = {n: verify_logits(model, n) for n in (1, 2, 5)}
    assert calls, "transformers no longer repeats the cache under a mask: serve/core/attention.py has nothing to do"
    calls.clear()
    monkeypatch.setenv(FORCE_GQA, "1")
    for n, logits in copied.items():
        torch.testing.assert_close(verify_logits(model, n), logits, rtol=1e-5, atol=1e-5)
    assert not calls


def test_loading_a_cpu_target_turns_it_on_unless_the_user_chose(monkeypatch, tiny_target_dir):
    monkeypatch.delenv(FORCE_GQA, raising=False)
    load_target(tiny_target_dir)
    assert os.environ.get(FORCE_GQA) == "1"  # set by loading, not by this test
    monkeypatch.setenv(FORCE_GQA, "0")
    load_target(tiny_target_dir)
    assert os.environ[FORCE_GQA] == "0"


def test_a_model_without_grouped_heads_is_left_alone(monkeypatch):
    monkeypatch.delenv(FORCE_GQA, raising=False)
    model = tiny_model("llama", num_key_value_heads=4).eval()
    assert not grouped_heads(model.config) and not gqa_wanted(model)
    assert not use_cpu_gqa(model)
    assert not grouped_heads(tiny_config("llama", num_key_value_heads=4))
