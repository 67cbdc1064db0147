"""Drafter folders of format 1, whose EAGLE heads were built on the target family's own decoder layer.

Format 2 builds every EAGLE head on a Llama layer (serve/drafters/draft_layer.py). A format-1 Llama or Mistral head
IS such a layer (same tensors, same maths; Mistral's sliding window is far longer than any draft context), so it is
converted exactly, in memory, at load. Any other family's layer (q/k norms, q/k/v biases, sandwich norms) has no Llama
equivalent: such a folder is refused with what to do. Medusa heads have no decoder layer and load as they are.
"""
from __future__ import annotations

from draftsmith.serve.drafters.draft_layer import DRAFT_ACT, draft_layer_config
from draftsmith.serve.core.errors import DraftsmithError

CONVERTIBLE = ("llama", "mistral")


def upgrade_v1(data: dict, *, source: str) -> dict:
    """A format-1 config.json (as a dict) -> the equivalent format-2 dict; DraftsmithError where none exists."""
    data = dict(data)
    family = data.get("model_type", "")
    data["target_model_type"] = family
    data["draftsmith_drafter"] = 2
    from draftsmith.serve.methods.registry import method

    if not method(str(data.get("method")), what=f"{source}: drafter method", trained=True).llama_layer:
        return data  # a head without a decoder layer (Medusa): nothing to convert
    layer = dict(data.get("layer_config") or {})
    biased = [flag for flag in ("attention_bias", "mlp_bias") if layer.get(flag)]
    act = layer.get("hidden_act", DRAFT_ACT)
    if family not in CONVERTIBLE or biased or act != DRAFT_ACT:
        why = (f"a {family!r} decoder layer" if family not in CONVERTIBLE
               else f"{', '.join(biased) or f'hidden_act={act}'} in its layer")
        raise DraftsmithError(f"{source} is a format-1 {data.get('method')} drafter built on {why}; draftsmith now "
                              f"builds every EAGLE head on the Llama layer vLLM and SGLang serve, and this one has no "
                              f"exact Llama equivalent: train it again (`draftsmith train --config RECIPE.yaml`); "
                              f"only Llama and Mistral heads convert")
    converted = draft_layer_config(layer, attn_implementation=layer.get("_attn_implementation", "sdpa"))
    converted["intermediate_size"] = int(layer["intermediate_size"])  # the trained layer's, whatever the rule now
    data["layer_config"] = converted
    data["model_type"] = converted["model_type"]
    return data
