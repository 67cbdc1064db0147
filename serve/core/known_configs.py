"""Built-in `config.json` fields of the large targets the recipes size (docs/recipes.md), so that a memory plan
(`draftsmith train --plan`, `draftsmith data capture --plan`) runs from a config alone: no weights, no network.

The fields are those of the public hub configs (Llama-3.1-8B-Instruct, Llama-3.3-70B-Instruct, Qwen3-32B,
Qwen3-30B-A3B); a plan reads only the architecture fields, so a fine-tune of one of them shares its entry.
"""
from __future__ import annotations

import copy

_LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}
_LLAMA3_COMMON = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": False,
                  "mlp_bias": False, "hidden_act": "silu", "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
                  "rope_scaling": _LLAMA3_ROPE, "max_position_embeddings": 131072, "vocab_size": 128256,
                  "tie_word_embeddings": False, "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009],
                  "torch_dtype": "bfloat16"}
_QWEN3_COMMON = {"attention_bias": False, "hidden_act": "silu", "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
                 "rope_scaling": None, "max_position_embeddings": 40960, "vocab_size": 151936, "head_dim": 128,
                 "tie_word_embeddings": False, "bos_token_id": 151643, "eos_token_id": 151645,
                 "use_sliding_window": False, "sliding_window": None, "torch_dtype": "bfloat16"}

KNOWN_CONFIGS: dict[str, dict] = {
    "llama-3.1-8b": {**_LLAMA3_COMMON, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                     "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128},
    "llama-3.3-70b": {**_LLAMA3_COMMON, "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
                      "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128},
    "qwen3-32b": {**_QWEN3_COMMON, "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
                  "hidden_size": 5120, "intermediate_size": 25600, "num_hidden_layers": 64,
                  "num_attention_heads": 64, "num_key_value_heads": 8, "max_window_layers": 64},
    "qwen3-30b-a3b": {**_QWEN3_COMMON, "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
                      "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
                      "num_experts": 128, "num_experts_per_tok": 8, "norm_topk_prob": True, "decoder_sparse_step": 1,
                      "mlp_only_layers": [], "router_aux_loss_coef": 0.001, "num_hidden_layers": 48,
                      "num_attention_heads": 32, "num_key_value_heads": 4, "max_window_layers": 48},
}

# hub ids (and their base / instruct twins) -> the entry that holds their architecture
ALIASES = {
    "meta-llama/Llama-3.1-8B": "llama-3.1-8b", "meta-llama/Llama-3.1-8B-Instruct": "llama-3.1-8b",
    "meta-llama/Meta-Llama-3.1-8B-Instruct": "llama-3.1-8b",
    "meta-llama/Llama-3.3-70B-Instruct": "llama-3.3-70b", "meta-llama/Llama-3.1-70B-Instruct": "llama-3.3-70b",
    "Qwen/Qwen3-32B": "qwen3-32b", "Qwen/Qwen3-30B-A3B": "qwen3-30b-a3b",
    "Qwen/Qwen3-30B-A3B-Instruct-2507": "qwen3-30b-a3b",
}


def known_config(name: str) -> dict | None:
    """A copy of the built-in config dict a name (or hub id) stands for; None when there is none."""
    key = ALIASES.get(name, name.lower())
    return copy.deepcopy(KNOWN_CONFIGS[key]) if key in KNOWN_CONFIGS else None
