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


@pytest.mark.parametrize("queries,mask", [(1, "bool"), (1, "additive"), (1, None), (4, "bool"), (4, "additive")])
def test_grouped_attention_equals_sdpa(monkeypatch, queries, mask):
    from types import SimpleNamespace

    from draftsmith.serve.core import attention

    g = torch.Generator().manual_seed(0)
    batch, heads, kv_heads, keys, dim = 5, 6, 2, 37, 16
    query = torch.randn(batch, heads, queries, dim, generator=g)
    key, value = (torch.randn(batch, kv_heads, keys, dim, generator=g) for _ in range(2))
    allowed = torch.rand(batch, 1, queries, keys + 3, generator=g) > 0.4  # built longer than the cache, as may be
    for row, reach in enumerate((9, keys, 3, 20, keys)):  # rows of a slot cache, each seeing its own length
        allowed[row, ..., reach:] = False
    allowed[..., 0] = True
    masks = {"bool": allowed, "additive": torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo().min),
             None: None}
    module = SimpleNamespace(num_key_value_groups=heads // kv_heads, is_causal=True)
    expected, _ = sdpa_attention.sdpa_attention_forward(module, query, key, value, None if mask is None else
                                                        masks["bool"][..., :keys], scaling=0.3)
    monkeypatch.setattr(attention, "CHUNK_BYTES", 2 * kv_heads * keys * dim * 4)  # rows two at a time
    got, _ = attention.grouped_attention(module, query, key, value, masks[mask], scaling=0.3)
    assert got.shape == (batch, queries, heads, dim)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_a_chunk_of_rows_reads_its_own_columns_only(monkeypatch):
    """A slot cache's rows attend over the longest row's columns; a chunk of short rows reads only as far as they
    see (the columns past them hold NaN here: read, they would reach the output through 0 x NaN)."""
    from types import SimpleNamespace

    from draftsmith.serve.core import attention

    g = torch.Generator().manual_seed(1)
    batch, heads, kv_heads, keys, dim = 4, 4, 2, 30, 8
    query = torch.randn(batch, heads, 1, dim, generator=g)
    key, value = (torch.randn(batch, kv_heads, keys, dim, generator=g) for _ in range(2))
    reach = torch.tensor([5, 8, keys, 12])
    allowed = torch.arange(keys)[None, None, None, :] < reach[:, None, None, None]  # (B, 1, 1, L)
    assert attention.seen_columns(allowed).tolist() == reach.tolist()
    additive = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo().min)
    assert attention.seen_columns(additive).tolist() == reach.tolist()
    module = SimpleNamespace(num_key_value_groups=heads // kv_heads, is_causal=True)
    expected, _ = sdpa_attention.sdpa_attention_forward(module, query, key, value, allowed, scaling=0.3)
    key[:2, :, 8:], value[:2, :, 8:] = float("nan"), float("nan")  # past what rows 0 and 1 see
    monkeypatch.setattr(attention, "CHUNK_BYTES", 2 * kv_heads * keys * dim * 2 * 4)  # rows two at a time
    got, _ = attention.grouped_attention(module, query, key, value, allowed, scaling=0.3)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_what_grouped_attention_leaves_to_sdpa(monkeypatch):
    from types import SimpleNamespace

    from draftsmith.serve.core import attention

    calls = []
    monkeypatch.setattr(sdpa_attention, "sdpa_attention_forward", lambda *a, **k: calls.append(k) or (None, None))
    module = SimpleNamespace(num_key_value_groups=2)
    key = torch.zeros(1, 2, 64, 8)
    for queries, mask, extra in [(attention.FEW_QUERIES + 1, torch.ones(1, 1, 33, 64, dtype=torch.bool), {}),
                                 (3, None, {}),  # several queries, causal without a mask: a prefill
                                 (1, None, {"softcap": 30.0})]:
        attention.grouped_attention(module, torch.zeros(1, 4, queries, 8), key, key, mask, **extra)
    assert len(calls) == 3
    bf16 = tiny_model("llama").eval().to(torch.bfloat16)
    assert attention.grouped_wanted(bf16) and not attention.grouped_wanted(tiny_model("llama").eval())


def test_forwards_that_decide_no_token_take_it_in_bf16_and_give_the_attention_back(tiny_target_dir):
    from draftsmith.serve.core.attention import GROUPED
    from draftsmith.serve.core.invariant import is_invariant, suspended

    bf16 = load_target(tiny_target_dir, dtype="bfloat16")  # invariant (auto in bf16)
    fp32 = load_target(tiny_target_dir)
    with suspended(bf16.model), suspended(fp32.model):
        assert bf16.model.config._attn_implementation == GROUPED
        assert fp32.model.config._attn_implementation == "sdpa"  # as fast in float32: left as it is
    assert is_invariant(bf16.model) and fp32.model.config._attn_implementation == "sdpa"
    off = load_target(tiny_target_dir, dtype="bfloat16", invariant="off")
    with suspended(off.model):
        assert off.model.config._attn_implementation == GROUPED
    assert off.model.config._attn_implementation == "sdpa"


def test_an_indexers_selection_folds_into_the_mask_as_transformers_folds_it():
    """DeepSeek-V3.2 hands any attention other than eager and SDPA its indexer's top-k key indices instead of a
    folded mask: the grouped and invariant attentions fold them the way transformers does for SDPA."""
    from draftsmith.serve.core.attention import with_indices

    causal = torch.ones(2, 3, 5, dtype=torch.bool).tril(diagonal=2)[:, None]  # (B, 1, Q, L)
    indices = torch.tensor([[[0, 1], [1, 3], [2, 4]], [[4, 0], [3, 2], [1, 0]]], dtype=torch.int32)  # (B, Q, topk)
    unselected = torch.ones(2, 3, 5, dtype=torch.bool).scatter(-1, indices.long(), False)[:, None]
    assert torch.equal(with_indices(causal, indices, 5), causal & ~unselected)
    additive = torch.zeros(2, 1, 3, 5).masked_fill(~causal, torch.finfo(torch.float32).min)
    expected = additive.masked_fill(unselected, torch.finfo(torch.float32).min)
    assert torch.equal(with_indices(additive, indices, 5), expected)
    assert torch.equal(with_indices(None, indices, 5), ~unselected)
    assert with_indices(causal, None, 5) is causal
