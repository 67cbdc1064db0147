"""Tiny targets that ship an MTP layer: a tiny random target of a family with an MTP form (serve/methods/mtp/
shipped.py), its config naming one MTP layer (MiMo-V2's names none) and its checkpoint holding that layer under the
family's names, as the real checkpoints do (transformers' save_pretrained drops them, so they are written beside the
model's own)."""
from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from tests.tiny_models import save_tiny_target

# the count key each family's config names its MTP layers with
MTP_COUNT = {"qwen3_next": "mtp_num_hidden_layers", "qwen3_5": "mtp_num_hidden_layers",
             "qwen3_5_moe": "mtp_num_hidden_layers", "deepseek_v3": "num_nextn_predict_layers",
             "deepseek_v32": "num_nextn_predict_layers",
             "glm4_moe": "num_nextn_predict_layers", "ernie4_5_moe": "num_nextn_predict_layers",
             "nemotron_h": "num_nextn_predict_layers", "mimo_v2_flash": None}  # MiMo-V2's configs name none
# what else a family's config names for its MTP layer: Nemotron-H's step is an attention block then an MoE block (its
# mtp_hybrid_override_pattern, as Nemotron-3 Super's config.json names it), its experts as small as the rest
MTP_CONFIG = {"nemotron_h": dict(mtp_hybrid_override_pattern="*E", n_routed_experts=4, num_experts_per_tok=2,
                                 moe_intermediate_size=16, moe_shared_expert_intermediate_size=16)}
# MiMo-V2-Flash's config.json also names its layers the way vLLM's and SGLang's classes read them (transformers reads
# its own keys, and sliding_window_size + 1 as its window): written to agree with the tiny target's own, its window 8,
# so that the engine check's 12-token step runs past it
MTP_CONFIG["mimo_v2_flash"] = dict(
    swa_num_attention_heads=4, swa_num_key_value_heads=4, swa_head_dim=12, swa_v_head_dim=8, sliding_window_size=7,
    hybrid_layer_pattern=[0, 1], moe_layer_freq=[0, 1], add_swa_attention_sink_bias=True,
    add_full_attention_sink_bias=False, layernorm_epsilon=1e-5, rope_theta=5000000.0, swa_rope_theta=10000.0,
    partial_rotary_factor=0.334, topk_method="noaux_tc", scoring_func="sigmoid")


def add_mtp_layer(folder: str | Path, *, seed: int = 1, state: dict | None = None) -> Path:
    """Write an MTP layer into the tiny target at `folder` (random with `seed`, or the head state `state`)."""
    from draftsmith.serve.core.target import load_target, text_config
    from draftsmith.serve.methods.mtp.from_target import DEFAULT_K
    from draftsmith.serve.methods.mtp.head import MtpHead, layer_config, mtp_config
    from draftsmith.serve.methods.mtp.shipped import form_of, head_state_to_checkpoint

    folder = Path(folder)
    target = load_target(folder, dtype="float32")
    text = text_config(target.config)
    form = form_of(text)
    cfg = mtp_config(target, num_speculative_tokens=DEFAULT_K, norm_output=form.norm_output,
                     overrides=dict(form.overrides))
    torch.manual_seed(seed)
    head = MtpHead(cfg)
    with torch.no_grad():  # norms away from one, so that a misplaced norm shows
        for name, param in head.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(0.5, 1.5) if param.abs().sum() > 0 else param.uniform_(-0.5, 0.5)
    own = state if state is not None else head.state_dict()
    tensors = head_state_to_checkpoint(own, form, layer_config(cfg.layer_config))
    path = folder / "model.safetensors"
    weights = load_file(str(path))
    weights.update({form.prefix(text) + k: v.contiguous() for k, v in tensors.items()})
    save_file(weights, str(path), metadata={"format": "pt"})
    return folder


def save_mtp_target(folder: str | Path, family: str = "qwen3_next", *, seed: int = 0, mtp_seed: int = 1) -> Path:
    """A tiny target of `family` shipping one (random) MTP layer."""
    count = {MTP_COUNT[family]: 1} if MTP_COUNT[family] else {}
    save_tiny_target(folder, family, seed=seed, **count, **MTP_CONFIG.get(family, {}))
    return add_mtp_layer(folder, seed=mtp_seed)
