"""Which target families an engine can host an EAGLE draft on, read from the engines' released code.

The draft layer is a Llama layer for every family (serve/drafters/draft_layer.py); what differs is the TARGET's
class in the engine. EAGLE-3 needs it to capture the aux hidden states (vLLM: `SupportsEagle3`, else "Model does not
support EAGLE3 interface" at load; SGLang: `set_eagle3_layers_to_capture`); SGLang's EAGLE-1 and EAGLE-3 also need
`get_embed_and_head` to share the target's embeddings with the draft. vLLM's EAGLE-1 needs nothing of the target
class. Read in vLLM 0.33.0 and 0.34.0 (`model_executor/models/*.py`) and SGLang 0.5.23 (`srt/models/*.py`);
families a table does not name were not read and are refused rather than guessed. Check again per release.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from draftsmith.serve.core.errors import DraftsmithError


@dataclass(frozen=True)
class Hosts:
    engine: str
    read_in: str                                                 # the releases whose code was read
    classes: dict[str, str]                                      # family (text model_type) -> the engine's class
    eagle3: tuple[str, ...]                                      # families whose class captures aux states
    eagle1: tuple[str, ...] | None                               # None: any target class hosts EAGLE-1
    lacks: dict[str, str] = field(default_factory=dict)          # family -> what its class lacks

    def refusal(self, capability: str, family: str, version: str | None) -> str | None:
        """None when `family` hosts a draft needing `capability` (a field above: `eagle3`, `eagle1`); else one line
        naming the engine, the version and what it lacks."""
        hosted = getattr(self, capability)
        if hosted is None or family in hosted:
            return None
        release = f"{self.engine} {version}" if version else f"{self.engine} (read in {self.read_in})"
        if family in self.lacks:
            why = f"its {self.classes[family]} {self.lacks[family]}"
        else:
            why = (f"draftsmith has not read {self.engine}'s code for {family!r} targets (it knows "
                   f"{', '.join(sorted(hosted))})")
        return f"{release} cannot host an {capability} drafter for a {family!r} target: {why}"


_CLASSES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "phi3": "Phi3ForCausalLM",
            "qwen2": "Qwen2ForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM", "qwen3": "Qwen3ForCausalLM",
            "qwen3_moe": "Qwen3MoeForCausalLM", "gemma3_text": "Gemma3ForCausalLM", "gemma2": "Gemma2ForCausalLM",
            "gpt_oss": "GptOssForCausalLM"}

VLLM = Hosts(
    engine="vLLM", read_in="0.33.0-0.34.0", classes=_CLASSES,
    # Mistral and Phi-3 subclass LlamaForCausalLM (mistral.py, phi3.py)
    eagle3=("llama", "mistral", "phi3", "qwen2", "qwen3", "qwen3_moe", "gpt_oss"),
    eagle1=None,
    lacks={"gemma3_text": "does not implement SupportsEagle3 (no aux hidden-state capture); SGLang's does",
           "gemma2": "does not implement SupportsEagle3 (no aux hidden-state capture)",
           "qwen2_moe": "does not implement SupportsEagle3 (no aux hidden-state capture)"},
)
SGLANG = Hosts(
    engine="SGLang", read_in="0.5.23", classes=_CLASSES,
    # Mistral and Phi-3 subclass LlamaForCausalLM (mistral.py, llama.py)
    eagle3=("llama", "mistral", "phi3", "qwen2", "qwen3", "qwen3_moe", "gemma3_text", "gpt_oss"),
    eagle1=("llama", "mistral", "phi3", "qwen2", "qwen3", "qwen3_moe", "gemma3_text", "gpt_oss"),
    lacks={"gemma2": "has neither set_eagle3_layers_to_capture nor get_embed_and_head",
           "qwen2_moe": "has no get_embed_and_head (the draft cannot share the target's embeddings)"},
)
HOSTS = {"vllm": VLLM, "speculators": VLLM, "sglang": SGLANG}  # speculators folders are served by vLLM


def text_family(model_type: str) -> str:
    """A multimodal config's family as its text model's (`gemma3` -> `gemma3_text`)."""
    return {"gemma3": "gemma3_text"}.get(model_type, model_type)


def check_hosted(capability: str | None, target_model_type: str, fmt: str, version: str | None = None) -> None:
    """Raise (one line) when the engine behind `fmt` cannot host a draft needing `capability` (the method's form's
    `hosted_as`; None: any target class hosts it) on this target family."""
    if capability is None or not target_model_type:
        return
    problem = HOSTS[fmt].refusal(capability, text_family(target_model_type), version)
    if problem:
        other = [f for f, hosts in HOSTS.items() if hosts is not HOSTS[fmt]
                 and hosts.refusal(capability, text_family(target_model_type), None) is None]
        fix = f"export --format {other[0]} instead" if other else "serve it with `draftsmith serve`"
        raise DraftsmithError(f"--format {fmt}: {problem}. {fix[0].upper()}{fix[1:]}.")
