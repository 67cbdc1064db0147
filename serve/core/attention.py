"""Verification on a CPU without copying the KV cache: grouped-query attention through SDPA's `enable_gqa`.

A forward over several new tokens on a cached context (a verify forward, a tree, a drafter's catch-up) carries an
attention mask. transformers' `sdpa` attention then repeats every key/value head of the whole cache to the query
heads (`repeat_kv`: a copy of each layer's cache, every forward), because CUDA's fast SDPA kernels take no
grouped heads with a mask; a 1-token step has no mask and skips it. On a CPU, torch's SDPA attends grouped heads
under a mask itself (`enable_gqa`, torch 2.5+), and transformers takes it when `TRANSFORMERS_SDPA_FORCE_GQA=1`.

Measured on the default target (3 key/value heads for 9 query heads, fp32, 1 thread, 256-token context,
`measure_verify_costs` three times each way, alternating): verifying 1 draft cost 1.24-1.25 single-token steps
without the copy and 1.28-1.29 with it, 5 drafts 1.55-1.60 and 1.64-1.66; on a busier hour 2 new tokens cost 1.19
and 1.39 steps. The logits were bit-identical. Every method on the target gets it
(plain decoding, transformers' generate and its prompt lookup, our verification), so it changes what speculation
costs, not the baseline.
"""
from __future__ import annotations

import os

import torch

from draftsmith.serve.core.target_config import text_config

FORCE_GQA = "TRANSFORMERS_SDPA_FORCE_GQA"


def torch_has_gqa() -> bool:
    """torch's SDPA takes `enable_gqa` from 2.5 on."""
    major, minor = (int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
    return (major, minor) >= (2, 5)


def grouped_heads(config) -> bool:
    config = text_config(config)
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    return bool(heads and kv_heads and kv_heads < heads)


def gqa_wanted(model) -> bool:
    """Whether `model` (loaded) runs faster with SDPA's own grouped-query attention: sdpa attention on the CPU with
    fewer key/value heads than query heads."""
    param = next(model.parameters(), None)
    return (param is not None and param.device.type == "cpu" and torch_has_gqa()
            and getattr(model.config, "_attn_implementation", None) == "sdpa" and grouped_heads(model.config))


def use_cpu_gqa(model) -> bool:
    """Turn transformers' SDPA grouped-query switch on for `model` when `gqa_wanted` (process-wide: it is read at
    every attention call), unless the user set it. Returns whether it is on."""
    if gqa_wanted(model):
        os.environ.setdefault(FORCE_GQA, "1")
    return os.environ.get(FORCE_GQA) == "1"
