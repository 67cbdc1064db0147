"""Batched generation for self-distillation: left-padded prompts, one `generate` call per batch."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch


@dataclass
class Answer:
    token_ids: list[int]  # new tokens, up to and including the first EOS
    finished: bool  # ended with EOS (False: cut at max_new_tokens)


def left_pad(prompts: Sequence[Sequence[int]], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask), both (B, T_max), prompts right-aligned."""
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for b, prompt in enumerate(prompts):
        input_ids[b, width - len(prompt):] = torch.tensor(prompt, dtype=torch.long)
        attention_mask[b, width - len(prompt):] = 1
    return input_ids, attention_mask


def cut_at_eos(new_tokens: Sequence[int], eos_token_ids: Sequence[int]) -> Answer:
    eos = set(eos_token_ids)
    for i, token in enumerate(new_tokens):
        if token in eos:
            return Answer(token_ids=list(new_tokens[: i + 1]), finished=True)
    return Answer(token_ids=list(new_tokens), finished=False)


@torch.inference_mode()
def generate_batch(target: Any, prompts: Sequence[Sequence[int]], *, max_new_tokens: int,
                   temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                   seed: int | None = None) -> list[Answer]:
    """The target's answer to each prompt (token ids), sampled with its own generate loop."""
    from transformers import GenerationConfig

    model, tokenizer = target.model, target.tokenizer
    eos = target.eos_token_ids
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
    input_ids, attention_mask = left_pad(prompts, pad)
    sample = temperature > 0
    config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=sample, eos_token_id=eos,
                              pad_token_id=pad, **(dict(temperature=temperature, top_k=top_k or None, top_p=top_p)
                                                   if sample else {}))
    if seed is not None:
        torch.manual_seed(seed)
    device = next(model.parameters()).device
    out = model.generate(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device),
                         generation_config=config)  # (B, T_max + new)
    new = out[:, input_ids.shape[1]:].tolist()
    return [cut_at_eos(row, eos) for row in new]
