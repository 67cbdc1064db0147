"""Tiny self-distilled datasets for training tests: a few sequences of a tiny target's own greedy output,
written in the layout of `draftsmith data build` (HF datasets save_to_disk: input_ids, loss_mask, domain, id)."""
from __future__ import annotations

from pathlib import Path

import torch


def greedy_rows(target_dir: str | Path, *, rows: int = 24, prompt_len: int = 6, new_tokens: int = 40,
                seed: int = 0) -> list[dict]:
    from draftsmith.serve.core.target import load_target

    target = load_target(target_dir)
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(rows):
        prompt = torch.randint(0, 256, (1, prompt_len), generator=gen)
        ids = target.model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens,
                                    min_new_tokens=new_tokens, do_sample=False, pad_token_id=256)[0]
        mask = [0] * prompt_len + [1] * (len(ids) - prompt_len)
        out.append({"id": f"row{i}", "domain": ("code", "math")[i % 2], "input_ids": ids.tolist(),
                    "loss_mask": mask})
    return out


def save_rows(rows: list[dict], folder: str | Path) -> Path:
    from datasets import Dataset

    columns = {key: [r[key] for r in rows] for key in ("id", "domain", "input_ids", "loss_mask")}
    Dataset.from_dict(columns).save_to_disk(str(folder))
    return Path(folder)


# EAGLE-3 reads three distinct aux layers below the last one (serve/core/layers.py): its tiny targets need 4 layers.
EAGLE3_LAYERS = 4


def sharp_target(folder: str | Path, *, family: str = "llama", scale: float = 6.0, seed: int = 0,
                 num_hidden_layers: int = 2, **config_kwargs) -> Path:
    """A tiny target whose next-token distributions are peaked (lm_head scaled up), so its greedy text has
    structure a drafter can learn in a few hundred steps; still a valid random LM."""
    from tests.tiny_models import save_tiny_target
    from transformers import AutoModelForCausalLM

    folder = save_tiny_target(folder, family, seed=seed, num_hidden_layers=num_hidden_layers, **config_kwargs)
    model = AutoModelForCausalLM.from_pretrained(folder)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(scale)
    model.save_pretrained(folder)
    return Path(folder)
