"""serve/drafters/attention.py: a serving drafter head's few queries as grouped matmuls, equal to SDPA within the
precision; everything else, and training, left to SDPA."""
from __future__ import annotations

import pytest
import torch
from transformers.integrations import sdpa_attention

from draftsmith.serve.decoding import plain_generate, speculative_generate
from draftsmith.serve.drafters.attention import DRAFT_ATTENTION, draft_attention, use_draft_attention
from draftsmith.serve.drafters.folder import build_head, make_drafter
from draftsmith.serve.methods.eagle3.head import eagle3_config


class _Layer(torch.nn.Module):
    is_causal = True
    num_key_value_groups = 3


def _inputs(batch: int, queries: int, keys: int, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, 6, queries, 16, generator=g).to(dtype)  # 6 query heads on 2 key/value heads
    k = torch.randn(batch, 2, keys, 16, generator=g).to(dtype)
    v = torch.randn(batch, 2, keys, 16, generator=g).to(dtype)
    seen = torch.rand(batch, 1, queries, keys, generator=g) < 0.7
    seen[..., 0] = True  # every query sees a key
    return q, k, v, seen


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("batch,queries", [(1, 1), (4, 1), (3, 5)])
def test_few_queries_attend_as_sdpa_does(dtype, tol, batch, queries):
    q, k, v, seen = _inputs(batch, queries, 23, dtype)
    additive = torch.zeros(seen.shape, dtype=dtype).masked_fill_(~seen, torch.finfo(dtype).min)
    reference = sdpa_attention.sdpa_attention_forward(_Layer(), q.float(), k.float(), v.float(), seen)[0]
    for mask in (seen, additive, None):
        out, weights = draft_attention(_Layer(), q, k, v, mask)
        expected = reference if mask is not None else \
            sdpa_attention.sdpa_attention_forward(_Layer(), q.float(), k.float(), v.float(), None)[0] \
            if queries == 1 else None
        assert out.shape == (batch, queries, 6, 16) and out.dtype == dtype and weights is None
        if expected is not None:
            torch.testing.assert_close(out.float(), expected, rtol=tol, atol=tol)


def test_many_queries_and_what_it_does_not_compute_go_to_sdpa(monkeypatch):
    calls = []
    original = sdpa_attention.sdpa_attention_forward
    monkeypatch.setattr(sdpa_attention, "sdpa_attention_forward", lambda *a, **k: calls.append(1) or original(*a, **k))
    q, k, v, seen = _inputs(2, 40, 50, torch.float32)
    draft_attention(_Layer(), q, k, v, seen)  # a prefill
    q, k, v, seen = _inputs(2, 3, 50, torch.float32)
    draft_attention(_Layer(), q, k, v, None)  # an implicit causal mask over several queries
    draft_attention(_Layer(), q, k, v, seen, dropout=0.1)  # training
    assert len(calls) == 3
    draft_attention(_Layer(), q, k, v, seen)
    assert len(calls) == 3


def test_a_served_head_switches_and_drafts_what_the_target_accepts(tiny_target, monkeypatch):
    from transformers import AttentionInterface

    head = build_head(eagle3_config(tiny_target, aux_layer_ids=[0, 1, 1]))
    layer_configs = {id(m.config): m.config for m in head.modules() if hasattr(m, "config")
                     and hasattr(m.config, "_attn_implementation")}
    assert {c._attn_implementation for c in layer_configs.values()} == {"sdpa"}  # as trained
    drafter = make_drafter(head, tiny_target, check=False)
    assert {c._attn_implementation for c in layer_configs.values()} == {DRAFT_ATTENTION}
    assert head.config.layer_config["_attn_implementation"] == "sdpa"  # what a saved drafter writes is unchanged
    queries = []
    monkeypatch.setitem(AttentionInterface._global_mapping, DRAFT_ATTENTION,
                        lambda *a, **k: queries.append(a[1].shape[2]) or draft_attention(*a, **k))
    ids = (torch.arange(12) * 37 % 250 + 3)[None]
    out = speculative_generate(tiny_target, drafter, ids, max_new_tokens=24, k=3, eos_token_ids=())
    assert out.output_ids == plain_generate(tiny_target, ids, max_new_tokens=24, eos_token_ids=()).output_ids
    assert queries.count(1) >= out.stats.cycles  # each draft step a query per row, through the matmuls


def test_a_head_off_the_cpu_is_left_alone():
    head = torch.nn.Linear(2, 2, device="meta")
    assert not use_draft_attention(head)
