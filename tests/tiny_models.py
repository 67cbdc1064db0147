"""Tiny seeded random targets (HF pattern: hidden 32, 2 layers) with a byte-level tokenizer and a chat
template, saved to a folder. Every test builds on these; none touches the network."""
from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# ChatML with {% generation %} markers, so `return_assistant_tokens_mask` works on it.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}"
    "{{ '<|im_start|>assistant\n' }}{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\n' }}"
    "{% else %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

FAMILIES = {
    "llama": dict(model_type="llama"),
    "qwen2": dict(model_type="qwen2"),
    "qwen3": dict(model_type="qwen3", head_dim=8),
    "mistral": dict(model_type="mistral"),
    # tied, as Google's Gemma-3 checkpoints are (SGLang 0.5.23 serves no other: serve/core/families.py)
    "gemma": dict(model_type="gemma3_text", head_dim=8, query_pre_attn_scalar=8, sliding_window=64,
                  tie_word_embeddings=True),
    "phi3": dict(model_type="phi3"),
    "qwen3_moe": dict(model_type="qwen3_moe", head_dim=8, num_experts=4, num_experts_per_tok=2,
                      moe_intermediate_size=16),
    # sliding and full layers, attention sinks, experts, YaRN RoPE: what a gpt-oss target brings
    "gpt_oss": dict(model_type="gpt_oss", head_dim=8, num_local_experts=4, num_experts_per_tok=2, sliding_window=64,
                    rope_parameters=dict(rope_type="yarn", rope_theta=150000.0, factor=32.0, beta_fast=32.0,
                                         beta_slow=1.0, truncate=False, original_max_position_embeddings=16)),
    # targets whose checkpoints ship multi-token-prediction layers (MTP_FAMILIES): the config's count of them is 1,
    # as in theirs (the base model ignores it; MiMo's config has none). DeepSeek-V3: multi-head latent attention
    # (low-rank q and kv, a decoupled RoPE key; transformers caches the latent and the RoPE key), a dense first
    # layer, then routed and shared experts, routed by sigmoid scores with a bias (transformers' only routing; vLLM
    # reads it from the config's topk_method and scoring_func, as DeepSeek-V3's config.json writes them)
    "deepseek_v3": dict(model_type="deepseek_v3", num_key_value_heads=4, q_lora_rank=16, kv_lora_rank=16,
                        qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8, n_routed_experts=4,
                        num_experts_per_tok=2, n_shared_experts=1, moe_intermediate_size=16, n_group=1, topk_group=1,
                        first_k_dense_replace=1, num_nextn_predict_layers=1,
                        topk_method="noaux_tc", scoring_func="sigmoid"),  # as its config.json names its routing
    # DeepSeek-V3.2: V3 plus the lightning indexer (DSA), whose own key cache scores every cached token per query and
    # keeps the top index_topk of them for the latent attention; 8 keys, so that the prompts and answers run past it
    "deepseek_v32": dict(model_type="deepseek_v32", num_key_value_heads=4, q_lora_rank=16, kv_lora_rank=16,
                         qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8, n_routed_experts=4,
                         num_experts_per_tok=2, n_shared_experts=1, moe_intermediate_size=16, n_group=1, topk_group=1,
                         first_k_dense_replace=1, num_nextn_predict_layers=1, index_topk=8, index_head_dim=8,
                         index_n_heads=8, topk_method="noaux_tc", scoring_func="sigmoid"),
    # GLM-4.5: its real configs name head_dim (128: 96 heads of a 4096/5120 hidden), which vLLM's Glm4MoE layers read
    "glm4_moe": dict(model_type="glm4_moe", head_dim=8, use_qk_norm=True, n_routed_experts=4, num_experts_per_tok=2,
                     n_shared_experts=1, moe_intermediate_size=16, first_k_dense_replace=1,
                     num_nextn_predict_layers=1),
    "ernie4_5_moe": dict(model_type="ernie4_5_moe", moe_num_experts=4, moe_k=2, moe_num_shared_experts=1,
                         moe_intermediate_size=16, moe_layer_start_index=1, num_nextn_predict_layers=1),
    # sliding layers with twice the key/value heads and attention sinks, values narrower than keys, partial RoPE
    "mimo_v2_flash": dict(model_type="mimo_v2_flash", head_dim=12, v_head_dim=8, sliding_window=16,
                          n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16),
}
# their real checkpoints ship MTP layers
MTP_FAMILIES = ("deepseek_v3", "deepseek_v32", "glm4_moe", "ernie4_5_moe", "mimo_v2_flash")

# Hybrid targets: linear-attention (Gated DeltaNet), Mamba-2 or short-convolution layers beside attention, whose cache
# holds a recurrent state (serve/core/kv.py), and Gemma 4. Four layers, so that EAGLE-3 has three aux layers and the
# default layer_types hold both kinds. Decoded and drafted at batch 1 and in the batched decoder (their recurrent
# states per row: serve/core/recurrent_slots.py), and trained.
_GDN = dict(linear_key_head_dim=8, linear_value_head_dim=8, linear_num_key_heads=2, linear_num_value_heads=4)
_EXPERTS = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=16)
HYBRID_FAMILIES = {
    "qwen3_5": dict(model_type="qwen3_5_text", head_dim=8, **_GDN),
    "qwen3_5_moe": dict(model_type="qwen3_5_moe_text", head_dim=8, **_GDN, **_EXPERTS),
    "qwen3_next": dict(model_type="qwen3_next", head_dim=8, **_GDN, **_EXPERTS),
    "nemotron_h": dict(model_type="nemotron_h", head_dim=8, mamba_num_heads=4, mamba_head_dim=8, ssm_state_size=8,
                       n_groups=1, hybrid_override_pattern="M-M*"),
    "granite_hybrid": dict(model_type="granitemoehybrid", mamba_n_heads=4, mamba_d_head=16, mamba_d_state=8,
                           mamba_n_groups=1, num_local_experts=4, num_experts_per_tok=2,
                           layer_types=["mamba", "attention", "mamba", "attention"]),
    "falcon_h1": dict(model_type="falcon_h1", head_dim=8, mamba_n_heads=4, mamba_d_head=8, mamba_d_ssm=32,
                      mamba_d_state=8, mamba_n_groups=1),
    "lfm2": dict(model_type="lfm2", block_ff_dim=64, layer_types=["conv", "full_attention", "conv", "full_attention"]),
    "olmo_hybrid": dict(model_type="olmo_hybrid"),
    "gemma4": dict(model_type="gemma4_text", head_dim=8, vocab_size_per_layer_input=259,
                   hidden_size_per_layer_input=8),
}


def tiny_tokenizer(chat_template: str | None = CHAT_TEMPLATE) -> PreTrainedTokenizerFast:
    """Byte-level tokenizer: 256 byte tokens, then the special tokens (ids 256..258)."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    for tok in SPECIALS:
        vocab[tok] = len(vocab)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>",
                                  pad_token="<|endoftext|>", additional_special_tokens=SPECIALS[1:2])
    tok.add_special_tokens({"additional_special_tokens": SPECIALS})
    if chat_template:
        tok.chat_template = chat_template
    return tok


def tiny_config(family: str = "llama", *, vocab_size: int = 259, num_hidden_layers: int | None = None, **extra):
    fam = dict({**FAMILIES, **HYBRID_FAMILIES}[family])
    num_hidden_layers = num_hidden_layers or (4 if family in HYBRID_FAMILIES else 2)
    model_type = fam.pop("model_type")
    kwargs = dict(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=num_hidden_layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  tie_word_embeddings=False, bos_token_id=None, eos_token_id=258, pad_token_id=256)
    kwargs.update(fam)
    kwargs.update(extra)
    return AutoConfig.for_model(model_type, **kwargs)


def tiny_model(family: str = "llama", *, seed: int = 0, **config_kwargs):
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(family, **config_kwargs))
    # Random init gives near-uniform next-token distributions; sharpen them so greedy text has structure
    # and drafters have something to learn (a scaled lm_head keeps the model a valid random LM).
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(8.0)
    return model.eval()


def save_tiny_target(folder: str | Path, family: str = "llama", *, seed: int = 0,
                     chat_template: str | None = CHAT_TEMPLATE, **config_kwargs) -> Path:
    folder = Path(folder)
    model = tiny_model(family, seed=seed, **config_kwargs)
    model.generation_config.eos_token_id = 258
    model.save_pretrained(folder)
    tiny_tokenizer(chat_template).save_pretrained(folder)
    return folder
