"""What the project knows about a target family, one row each: whether draftsmith loads it, its class, what its
decoder has that a parameter count reads, its tiny test target, and which serving engines' target classes can host
an EAGLE draft on it (read from the engines' released code: vLLM 0.33.0-0.34.0 `model_executor/models/*.py`, SGLang
0.5.23 `srt/models/*.py`). Target loading, the memory plan, the exporters' hosting check (serve/export/hosts.py),
scripts/check_engines.py and scripts/support_matrix.py read this table; a family is added as one row.

Hosting: EAGLE-3 needs the target's class to capture the aux hidden states (vLLM: `SupportsEagle3`, else "Model does
not support EAGLE3 interface" at load; SGLang: `set_eagle3_layers_to_capture`); SGLang's EAGLE-1 and EAGLE-3 also
need `get_embed_and_head` to share the target's embeddings with the draft. vLLM's EAGLE-1 needs nothing of the target
class. An engine a row does not name was not read for that family, and is refused rather than guessed. `untied`: an
engine whose class for the family serves a checkpoint only with its lm_head tied to its embeddings.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional

HOSTED = None  # the engine's class for this family hosts the capability


@dataclass(frozen=True)
class Family:
    model_type: str                    # the text config's model_type
    causal_lm: str                     # its *ForCausalLM class, in transformers and the engines
    loads: bool = True                 # draftsmith loads it as a target (tested)
    aliases: tuple[str, ...] = ()      # multimodal model_types whose text model is this family (gemma3)
    qk_norm: bool = False              # RMSNorm on q and k (a parameter count reads it)
    attention_bias: bool = False       # q/k/v biases unless its config says otherwise
    tiny: Optional[str] = None         # its name among tests/tiny_models.py's targets; None: no tiny target
    recurrent: bool = False            # layers that carry a recurrent / convolution state (hybrid targets)
    planned: bool = True               # the memory plan models its decoder (serve/core/target_arch.py)
    refused: Optional[str] = None      # a family draftsmith does not load: why, and what to do instead (one line)
    # engine -> the draft it is asked to host (`EAGLE-3`, `EAGLE-1`: a method form's `hosted_as`) -> HOSTED, or what
    # the engine's class for this family lacks
    hosts: Mapping[str, Mapping[str, Optional[str]]] = field(default_factory=dict)
    # engine -> why its class for this family cannot serve a target whose lm_head is not its embedding matrix
    untied: Mapping[str, str] = field(default_factory=dict)


_BOTH = {"EAGLE-3": HOSTED, "EAGLE-1": HOSTED}
_EVERYWHERE = {"vLLM": {"EAGLE-3": HOSTED}, "SGLang": _BOTH}
_NO_AUX = "does not implement SupportsEagle3 (no aux hidden-state capture)"
_VLLM_DOES = " (no aux hidden-state capture); vLLM's does"
# a class with no EAGLE hook in either engine (Gemma 2, Granite-4 hybrid, LFM2); vLLM's EAGLE-1 needs none
_NO_HOOKS = {"vLLM": {"EAGLE-3": _NO_AUX},
             "SGLang": dict.fromkeys(("EAGLE-3", "EAGLE-1"),
                                     "has neither set_eagle3_layers_to_capture nor get_embed_and_head")}

# rows in the support matrix's order (README); Mistral and Phi-3 subclass LlamaForCausalLM in both engines
FAMILIES: tuple[Family, ...] = (
    Family("llama", "LlamaForCausalLM", tiny="llama", hosts=_EVERYWHERE),
    Family("mistral", "MistralForCausalLM", tiny="mistral", hosts=_EVERYWHERE),
    Family("phi3", "Phi3ForCausalLM", tiny="phi3", hosts=_EVERYWHERE),
    Family("qwen2", "Qwen2ForCausalLM", attention_bias=True, tiny="qwen2", hosts=_EVERYWHERE),
    Family("qwen3", "Qwen3ForCausalLM", qk_norm=True, tiny="qwen3", hosts=_EVERYWHERE),
    Family("qwen3_moe", "Qwen3MoeForCausalLM", qk_norm=True, tiny="qwen3_moe", hosts=_EVERYWHERE),
    # SGLang 0.5.23 gemma3_causal.py: its decoder layers hand the residual on apart from the layer's output (:410), and
    # the model captures the EAGLE-3 state at a layer's input before adding it (:656), i.e. the previous layer's
    # post_feedforward_layernorm output; the stream transformers' hidden_states hold (and draftsmith trains on) is
    # their sum. load_weights skips lm_head.weight (:896) and forward computes the target's logits with embed_tokens
    # (:790): an untied checkpoint's lm_head stays unloaded, and get_embed_and_head (:947) hands it to the EAGLE-1
    # draft. Google's Gemma-3 checkpoints are tied. vLLM's Gemma3ForCausalLM ties only when the config does
    Family("gemma3_text", "Gemma3ForCausalLM", aliases=("gemma3",), qk_norm=True, tiny="gemma",
           hosts={"vLLM": {"EAGLE-3": _NO_AUX},
                  "SGLang": {"EAGLE-3": "captures the EAGLE-3 states before the residual add (each layer's "
                                        "post_feedforward_layernorm output, gemma3_causal.py:656), not the "
                                        "residual stream draftsmith's heads are trained on",
                             "EAGLE-1": HOSTED}},
           untied={"SGLang": "never loads an untied lm_head.weight: it scores the target with the embedding matrix "
                             "and hands the EAGLE-1 draft an unloaded lm_head (gemma3_causal.py:896, :790, :947), "
                             "so it serves tied Gemma-3 checkpoints only"}),
    Family("gpt_oss", "GptOssForCausalLM", tiny="gpt_oss", hosts=_EVERYWHERE),
    # targets that ship multi-token-prediction layers, whose latent attention (DeepSeek-V3), values narrower than keys
    # (MiMo), shared experts and dense first layers the memory plan does not model (`--plan` refuses them); hosting
    # read from the vLLM 0.33.0 and 0.34.0 wheels (deepseek_v2.py, glm4_moe.py, ernie45_moe.py, mimo_v2.py) and the
    # SGLang 0.5.23 wheel (deepseek_v2.py, glm4_moe.py, ernie4.py, mimo_v2.py). SGLang's DeepseekV2ForCausalLM adds 1
    # to the EAGLE-3 layer ids only when the first is 1 (draftsmith's default set), and takes any other set as is
    Family("deepseek_v3", "DeepseekV3ForCausalLM", tiny="deepseek_v3", planned=False,
           hosts=_EVERYWHERE),
    # DeepSeek-V3.2: V3 plus the lightning indexer and its key cache (DSA); vLLM 0.32.0/0.34.0's DeepseekV32ForCausalLM
    # (vllm/models/deepseek_v32/) and SGLang 0.5.23's (deepseek_v2.py) subclass their DeepseekV2ForCausalLM
    Family("deepseek_v32", "DeepseekV32ForCausalLM", tiny="deepseek_v32", planned=False,
           hosts=_EVERYWHERE),
    # DeepSeek-V4 (transformers 5.25 modeling_deepseek_v4.py): its compressed-attention layers' caches
    # (DeepseekV4CSACache / HCACache, `is_croppable = False`) hold a compressor's buffered tokens, emitted entries and
    # overlap state, and a sliding window kept without past recording: a rejected draft cannot be taken back out of
    # them, and the batched decoder's rows, each at its own position, cannot share transformers' compressor, which
    # windows every row alike. Its MTP layer (mtp.{i}.*: e_proj and h_proj over the hc_mult residual streams, an
    # hc_head of its own) is none of the forms the MTP head reads; vLLM 0.34.0 serves it (DeepSeekV4MTP, CUDA / ROCm /
    # XPU; its CPU class raises NotImplementedError) and SGLang 0.5.23 (DeepseekV4ForCausalLMNextN)
    Family("deepseek_v4", "DeepseekV4ForCausalLM", loads=False, planned=False,
           refused="its compressed-attention caches (transformers' DeepseekV4CSACache / HCACache) cannot be rolled "
                   "back, so no draft can be verified on it, and its MTP layer (mtp.*) drafts from the hyper-connection "
                   "streams no draftsmith head reads; serve it with its own MTP layer: vLLM >= 0.34 on a GPU (`vllm "
                   "serve MODEL --speculative-config '{\"method\": \"mtp\", \"num_speculative_tokens\": 1}'`) or "
                   "SGLang (`--speculative-algorithm NEXTN`)"),
    Family("glm4_moe", "Glm4MoeForCausalLM", tiny="glm4_moe", planned=False,
           hosts={"vLLM": {"EAGLE-3": f"{_NO_AUX}; SGLang's does"}, "SGLang": _BOTH}),
    Family("ernie4_5_moe", "Ernie4_5_MoeForCausalLM", tiny="ernie4_5_moe", planned=False,
           hosts={"vLLM": {"EAGLE-3": _NO_AUX},
                  "SGLang": {"EAGLE-3": "has no set_eagle3_layers_to_capture (no aux hidden-state capture)",
                             "EAGLE-1": HOSTED}}),
    Family("mimo_v2_flash", "MiMoV2FlashForCausalLM", tiny="mimo_v2_flash", planned=False,
           hosts={"vLLM": {"EAGLE-3": HOSTED},
                  "SGLang": {"EAGLE-3": f"has no set_eagle3_layers_to_capture{_VLLM_DOES}", "EAGLE-1": HOSTED}}),
    Family("gemma", "GemmaForCausalLM"),
    Family("gemma2", "Gemma2ForCausalLM",
           hosts=_NO_HOOKS),
    Family("olmo2", "Olmo2ForCausalLM", qk_norm=True),
    # hybrids and Gemma 4 (tests/tiny_models.py HYBRID_FAMILIES), whose recurrent layers, per-layer embeddings and head
    # sizes the memory plan does not model yet (`--plan` refuses them); hosting read
    # from vLLM 0.33.0 and 0.34.0 and SGLang 0.5.23 like the rows above (SGLang's text-only Qwen3.5 classes are in
    # qwen3_5_text.py)
    Family("qwen3_5_text", "Qwen3_5ForCausalLM", aliases=("qwen3_5",), qk_norm=True, recurrent=True, planned=False,
           hosts=_EVERYWHERE),
    Family("qwen3_5_moe_text", "Qwen3_5MoeForCausalLM", aliases=("qwen3_5_moe",), qk_norm=True, recurrent=True,
           planned=False,
           hosts=_EVERYWHERE),
    Family("qwen3_next", "Qwen3NextForCausalLM", qk_norm=True, recurrent=True, planned=False,
           hosts=_EVERYWHERE),
    Family("nemotron_h", "NemotronHForCausalLM", recurrent=True, planned=False,
           hosts={"vLLM": {"EAGLE-3": HOSTED},
                  "SGLang": {"EAGLE-3": f"has no set_eagle3_layers_to_capture{_VLLM_DOES}", "EAGLE-1": HOSTED}}),
    Family("granitemoehybrid", "GraniteMoeHybridForCausalLM", recurrent=True, planned=False,
           hosts=_NO_HOOKS),
    Family("falcon_h1", "FalconH1ForCausalLM", recurrent=True, planned=False,
           hosts={"vLLM": {"EAGLE-3": _NO_AUX},
                  "SGLang": {"EAGLE-3": "has no set_eagle3_layers_to_capture (no aux hidden-state capture)",
                             "EAGLE-1": HOSTED}}),
    Family("lfm2", "Lfm2ForCausalLM", recurrent=True, planned=False,
           hosts=_NO_HOOKS),
    Family("olmo_hybrid", "OlmoHybridForCausalLM", recurrent=True, planned=False,
           hosts={"vLLM": {"EAGLE-3": _NO_AUX},
                  "SGLang": dict.fromkeys(("EAGLE-3", "EAGLE-1"), "is not in this release (no model serves it)")}),
    Family("gemma4_text", "Gemma4ForCausalLM", aliases=("gemma4",), qk_norm=True, planned=False,
           hosts=_EVERYWHERE),
    Family("qwen2_moe", "Qwen2MoeForCausalLM", loads=False, attention_bias=True,
           hosts={"vLLM": {"EAGLE-3": _NO_AUX},
                  "SGLang": dict.fromkeys(("EAGLE-3", "EAGLE-1"), "has no get_embed_and_head (the draft cannot share "
                                                                "the target's embeddings)")}),
)


def family_of(model_type: str) -> Optional[Family]:
    """The row of `model_type` (a family's own, or a multimodal alias of it); None for a family not in the table."""
    return next((f for f in FAMILIES if model_type == f.model_type or model_type in f.aliases), None)


def text_family(model_type: str) -> str:
    """A multimodal config's family as its text model's (`gemma3` -> `gemma3_text`)."""
    found = family_of(model_type)
    return found.model_type if found is not None else model_type


def loadable_model_types() -> tuple[str, ...]:
    """Every model_type draftsmith loads as a target (aliases included)."""
    return tuple(t for f in FAMILIES if f.loads for t in (f.model_type, *f.aliases))


def tiny_families() -> tuple[str, ...]:
    """The tiny test targets' names, in the table's order (the support matrix, scripts/check_engines.py)."""
    return tuple(f.tiny for f in FAMILIES if f.tiny)
