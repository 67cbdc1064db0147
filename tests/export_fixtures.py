"""Native drafter folders with random (seeded) weights for export tests: every method, reduced vocabularies with
a scattered d2t, unsorted EAGLE-3 aux layers and non-zero Medusa biases, so a mistranslation changes drafts."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from draftsmith.serve.drafters.folder import build_head, save_drafter
from draftsmith.serve.core.target import load_target


def _scatter_vocab(head, vocab: int, draft_vocab: int, seed: int) -> None:
    keep = torch.randperm(vocab, generator=torch.Generator().manual_seed(seed))[:draft_vocab].sort().values
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[keep] = True
    head.d2t.copy_(keep - torch.arange(draft_vocab))
    head.t2d.copy_(t2d)


def make_native(target, method: str, folder: str | Path, *, seed: int = 0, **options) -> Path:
    """A random-weight drafter of `method` for `target`, saved as a native drafter folder."""
    from draftsmith.serve.methods.eagle1.head import eagle1_config
    from draftsmith.serve.methods.eagle3.head import eagle3_config
    from draftsmith.serve.methods.medusa.head import medusa_config

    torch.manual_seed(seed)
    if method == "eagle1":
        config = eagle1_config(target, **options)
    elif method == "eagle3":
        config = eagle3_config(target, **{"aux_layer_ids": [2, 0, 1], "draft_vocab_size": 120, **options})
    elif method == "dflash":
        from draftsmith.serve.methods.dflash.head import dflash_config

        config = dflash_config(target, **{"block_size": 4, "draft_layers": 2, "aux_layer_ids": [2, 0, 1], **options})
    elif method == "peagle":
        from draftsmith.serve.methods.peagle.head import peagle_config

        config = peagle_config(target, **{"depths": 4, "aux_layer_ids": [2, 0, 1], "draft_vocab_size": 120,
                                          **options})
    elif method == "mtp":  # a layer of the target's family, in the form its checkpoints keep (output norm, overrides)
        from draftsmith.serve.core.target import text_config
        from draftsmith.serve.methods.mtp.head import mtp_config
        from draftsmith.serve.methods.mtp.shipped import form_of

        form = form_of(text_config(target.config))
        config = mtp_config(target, **{"norm_output": bool(form and form.norm_output),
                                       "overrides": dict(form.overrides) if form else None, **options})
    elif method == "medusa":
        config = medusa_config(target, **{"num_heads": 3, "draft_vocab_size": 150, **options})
    elif method == "gemma4_assistant":  # a fresh assistant reading the target's store layers (sliding, then full)
        from draftsmith.serve.methods.gemma4_assistant.head import assistant_head_config

        config = assistant_head_config(target, **{"num_speculative_tokens": 3, "ttt_steps": 1, "layers": 2, **options})
    else:
        raise ValueError(f"no random-weight {method} drafter is made here (tests/export_fixtures.py)")
    head = build_head(config)
    if config.uses_draft_vocab:
        _scatter_vocab(head, config.vocab_size, config.draft_vocab_size, seed)
    if method == "medusa":
        with torch.no_grad():
            for block in head.blocks:
                for layer in block.layers:
                    layer.weight.normal_(std=0.2)
                    layer.bias.normal_(std=0.5)
    with torch.no_grad():  # non-trivial norms, so a norm that goes missing shows
        for name, param in head.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
    return save_drafter(head, config, folder)


@pytest.fixture(scope="module")
def target(tiny_target_factory):
    """The tiny 4-layer llama target every export test exports for."""
    return load_target(tiny_target_factory("llama", num_hidden_layers=4))
