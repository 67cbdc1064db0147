"""The native drafter folder: config.json (HeadConfig) + model.safetensors (the head's own tensors only).

The target's embeddings and lm_head are never stored (EAGLE reads them from the target at load time);
loading against a target with another tokenizer or architecture is an error naming both.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from serve.drafters.head_config import FORMAT_KEY, FORMAT_VERSION, HeadConfig, METHODS
from serve.drafters.identity import check_target_identity
from serve.drafters.settings import tree_from_record
from serve.errors import DraftsmithError

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"


def build_head(config: HeadConfig) -> nn.Module:
    """An untrained head module of `config.method` (weights freshly initialized)."""
    if config.method == "eagle1":
        from serve.drafters.eagle1 import Eagle1Head
        return Eagle1Head(config)
    if config.method == "eagle3":
        from serve.drafters.eagle3 import Eagle3Head
        return Eagle3Head(config)
    if config.method == "medusa":
        from serve.drafters.medusa import MedusaHeads
        return MedusaHeads(config)
    raise DraftsmithError(f"unknown drafter method {config.method!r}; choose one of {', '.join(METHODS)}")


# `DIR:length=fixed`, `DIR:min_confidence=0.3` (serve.drafters.build_drafter)
DRAFTER_OPTIONS = {"min_confidence": float, "length": str}


def make_drafter(head: nn.Module, target, *, check: bool = True, min_confidence: float | None = None,
                 length: str = "fixed"):
    """Wrap a head module (trained or not) into the Drafter the decoder drives; it drafts as its config records
    (K, tree, min_confidence) unless told otherwise.

    length: `fixed` drafts K tokens every cycle; `auto` drafts while the expected gain of one more token exceeds
    its cost (serve/drafters/length.py). min_confidence > 0: chains stop where the draft's top-1 probability
    falls below it (the policy then; 0 = the length policy decides)."""
    from serve.costs import verify_costs_for
    from serve.drafters.length import build_policy

    config = head.config
    min_confidence = config.min_confidence if min_confidence is None else min_confidence
    policy = build_policy(length, costs=verify_costs_for(target.model) if length == "auto" and not min_confidence
                          else None, min_confidence=min_confidence)
    if config.method == "medusa":
        from serve.drafters.medusa import MedusaDrafter
        drafter = MedusaDrafter(head, target, check=check, policy=policy)
    else:
        from serve.drafters.eagle_drafter import EagleDrafter
        drafter = EagleDrafter(head, target, check=check, policy=policy)
    drafter.default_k = config.num_speculative_tokens
    drafter.default_tree = tree_from_record(config.tree)
    return drafter


def save_drafter(module: nn.Module, config: HeadConfig, out_dir: str | Path) -> Path:
    """Write config.json + model.safetensors (contiguous CPU tensors, native names) and return the folder."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    state = {name: t.detach().to("cpu").contiguous() for name, t in module.state_dict().items()}
    save_file(state, str(out / WEIGHTS_NAME), metadata={"format": "pt", "method": config.method})
    (out / CONFIG_NAME).write_text(json.dumps(config.to_dict(), indent=2, sort_keys=True) + "\n")
    return out


def is_drafter_folder(path: str | Path) -> bool:
    cfg = Path(path) / CONFIG_NAME
    if not cfg.is_file():
        return False
    try:
        return FORMAT_KEY in json.loads(cfg.read_text())
    except (json.JSONDecodeError, TypeError):
        return False


def read_config(path: str | Path) -> HeadConfig:
    folder = Path(path)
    if not is_drafter_folder(folder):
        raise DraftsmithError(f"{folder} is not a draftsmith drafter folder (no config.json with "
                              f"a {FORMAT_KEY!r} entry); train one with `draftsmith train`")
    data = json.loads((folder / CONFIG_NAME).read_text())
    if int(data[FORMAT_KEY]) > FORMAT_VERSION:
        raise DraftsmithError(f"{folder} was written in drafter format {data[FORMAT_KEY]}; this draftsmith "
                              f"reads up to {FORMAT_VERSION}: upgrade draftsmith")
    return HeadConfig.from_dict(data)


def load_head(path: str | Path, *, device: str | torch.device = "cpu",
              dtype: torch.dtype = torch.float32) -> nn.Module:
    """The head module with its trained weights (strict: every stored tensor and no other)."""
    config = read_config(path)
    head = build_head(config)
    state = load_file(str(Path(path) / WEIGHTS_NAME))
    missing, unexpected = head.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise DraftsmithError(f"drafter weights in {path} do not match its {config.method} config: missing "
                              f"{sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}")
    head.to(device=device, dtype=dtype)  # floating tensors only; d2t/t2d keep their integer/bool types
    return head


def load_drafter(path: str | Path, target, **opts):
    """Load a drafter folder for `target`; raises DraftsmithError if it was trained for another target.

    opts: DRAFTER_OPTIONS as strings or values; the length policy is `auto` unless `length` says otherwise."""
    unknown = sorted(set(opts) - set(DRAFTER_OPTIONS))
    if unknown:
        raise DraftsmithError(f"unknown drafter folder option(s) {unknown}; valid: {', '.join(DRAFTER_OPTIONS)}")
    config = read_config(path)
    check_target_identity(config, target)
    weight = target.model.get_input_embeddings().weight
    head = load_head(path, device=weight.device, dtype=weight.dtype)
    return make_drafter(head, target, **{"length": "auto", **{k: DRAFTER_OPTIONS[k](v) for k, v in opts.items()}})
