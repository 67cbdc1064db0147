"""Peers: what a user would otherwise run, measured in the same loop as our decoder.

transformers' own `generate`: plain (`hf_plain`), prompt lookup (`prompt_lookup_num_tokens=K`,
`hf_prompt_lookup`), and assisted generation with a small causal LM (`assistant_model=`,
`hf_assisted:<drafter>`) for each `model` drafter. Target forwards are counted with a forward hook
so the peers get a μ too. Prompt lookup keeps transformers' default `max_matching_ngram_size` (2), what a
user gets; see https://huggingface.co/docs/transformers/generation_strategies.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from draftsmith.serve.methods.registry import has
from draftsmith.serve.core.target import Target


@dataclass
class Peer:
    name: str
    kind: str  # "hf_generate" | "prompt_lookup" | "assisted"
    assistant: Any = None  # the assistant model for kind "assisted"
    drafter: str | None = None  # the drafter this peer mirrors

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "drafter": self.drafter}


def assistant_model_of(entry: Any, *, dtype: torch.dtype, device: str) -> Any:
    """The HF causal LM behind a `model` drafter: the drafter's own module if it exposes one, else
    loaded from its path."""
    module = getattr(entry.drafter, "model", None)
    if isinstance(module, torch.nn.Module) and hasattr(module, "generate"):
        return module
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(entry.path, dtype=dtype).to(device).eval()


def build_peers(entries: Sequence[Any], *, hf_plain: bool, dtype: torch.dtype, device: str) -> list[Peer]:
    peers = [Peer("hf_plain", "hf_generate")] if hf_plain else []
    peers.append(Peer("hf_prompt_lookup", "prompt_lookup", drafter=next(
        (e.name for e in entries if has(e.kind, "lookup")), None)))
    for entry in entries:
        if has(entry.kind, "assistant") and entry.path:
            peers.append(Peer(f"hf_assisted:{entry.name}", "assisted", drafter=entry.name,
                              assistant=assistant_model_of(entry, dtype=dtype, device=device)))
    return peers


def generation_config(target: Target, *, max_new_tokens: int, temperature: float, top_k: int, top_p: float):
    from transformers import GenerationConfig

    kwargs: dict[str, Any] = dict(max_new_tokens=max_new_tokens, eos_token_id=target.eos_token_ids,
                                  pad_token_id=target.tokenizer.pad_token_id, do_sample=temperature > 0)
    if temperature > 0:
        kwargs.update(temperature=temperature, top_k=top_k, top_p=top_p)
    else:
        kwargs.update(top_k=None, top_p=None, temperature=None)
    return GenerationConfig(**kwargs)


@torch.inference_mode()
def run_peer(peer: Peer, target: Target, input_ids: Sequence[int], *, k: int, max_new_tokens: int,
             temperature: float, top_k: int, top_p: float, seed: int | None) -> dict[str, Any]:
    """One generation by `peer`: output tokens, wall seconds, target forwards."""
    model = target.model
    config = generation_config(target, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k,
                               top_p=top_p)
    extra: dict[str, Any] = {}
    if peer.kind == "prompt_lookup":
        config.prompt_lookup_num_tokens = k
    elif peer.kind == "assisted":
        extra["assistant_model"] = peer.assistant
        # a fixed K, as our decoder uses, rather than transformers' adaptive schedule
        config.num_assistant_tokens = k
        config.num_assistant_tokens_schedule = "constant"
    device = next(model.parameters()).device
    ids = torch.tensor([list(input_ids)], dtype=torch.long, device=device)  # (1, T)
    forwards = [0]
    handle = model.register_forward_hook(lambda *_: forwards.__setitem__(0, forwards[0] + 1))
    try:
        if seed is not None:
            torch.manual_seed(seed)
        start = time.perf_counter()
        out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config, **extra)
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
    finally:
        handle.remove()
    return {"output_token_ids": out[0, ids.shape[1]:].tolist(), "seconds": seconds, "target_forwards": forwards[0]}
