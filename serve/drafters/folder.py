"""The native drafter folder: config.json (HeadConfig) + model.safetensors (the head's own tensors only) +
checksums.json (the weights' sha256 and size, written with them).

The target's embeddings and lm_head are never stored (EAGLE reads them from the target at load time);
loading against a target with another tokenizer or architecture is an error naming both. Loading checks the
weights against checksums.json (a folder written before it existed loads unchecked), and refuses a damaged
config.json or weights file, and non-finite (NaN / inf) weights, with what happened and what to do.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save
from torch import nn

from draftsmith.serve.drafters.head_config import FORMAT_KEY, FORMAT_VERSION, HeadConfig
from draftsmith.serve.drafters.identity import check_target_identity
from draftsmith.serve.drafters.leaves import MAX_LEAVES
from draftsmith.serve.drafters.attention import use_draft_attention
from draftsmith.serve.drafters.legacy import upgrade_v1
from draftsmith.serve.drafters.settings import tree_from_record
from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.core.files import atomic_path, write_text_atomic
from draftsmith.serve.core.identity import sha256_file
from draftsmith.serve.core.packed import pack_head
from draftsmith.serve.methods.registry import method
from draftsmith.serve.core.target import Target

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
CHECKSUMS_NAME = "checksums.json"  # {WEIGHTS_NAME: {"sha256": hex, "bytes": n}}


class DrafterFolderError(DraftsmithError):
    """A drafter folder that cannot be loaded: damaged, incomplete, or not one."""


def build_head(config: HeadConfig) -> nn.Module:
    """An untrained head module of `config.method` (weights freshly initialized)."""
    return method(config.method, what="drafter method", trained=True).head(config)


# `DIR:length=fixed`, `DIR:min_confidence=0.3`, `DIR:leaves=0` (draftsmith.serve.drafters.build_drafter)
DRAFTER_OPTIONS = {"min_confidence": float, "length": str, "leaves": int}


def make_drafter(head: nn.Module, target: Target, *, check: bool = True, min_confidence: float | None = None,
                 length: str = "fixed", leaves: int = MAX_LEAVES):
    """Wrap a head module (trained or not) into the Drafter the decoder drives; it drafts as its config records
    (K, tree, min_confidence) unless told otherwise.

    length: `fixed` drafts K tokens every cycle; `auto` drafts while the expected gain of one more token exceeds
    its cost (serve/drafters/length.py). min_confidence > 0: chains stop where the draft's top-1 probability
    falls below it (the policy then; 0 = the length policy decides). leaves: at most this many runner-up drafts
    a head's greedy chain carries where the `auto` policy expects them to pay (serve/drafters/leaves.py; 0: plain
    chains)."""
    from draftsmith.serve.core.costs import verify_costs_for
    from draftsmith.serve.drafters.length import build_policy

    config = head.config
    pack_head(head, target.model)  # bf16 on a CPU: oneDNN's packed linears (serve/core/packed.py)
    use_draft_attention(head)  # on a CPU: few queries as grouped matmuls (serve/drafters/attention.py)
    min_confidence = config.min_confidence if min_confidence is None else min_confidence
    policy = build_policy(length, costs=verify_costs_for(target.model) if length == "auto" and not min_confidence
                          else None, min_confidence=min_confidence)
    drafter = method(config.method, what="drafter method", trained=True).drafter(head, target, check=check, policy=policy,
                                                                    leaves=leaves)
    drafter.default_k = config.num_speculative_tokens
    drafter.default_tree = tree_from_record(config.tree)
    return drafter


def check_finite(state: dict[str, torch.Tensor], where: str | Path) -> None:
    """DrafterFolderError naming the tensors that hold NaN or inf (a diverged training run, or damage)."""
    bad = [name for name, t in state.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    if bad:
        raise DrafterFolderError(f"{where}: the drafter weights hold NaN or inf in {len(bad)} tensor(s) "
                                 f"({', '.join(sorted(bad)[:3])}): training diverged or the file is damaged; train "
                                 f"again (a lower optim.lr, optim.max_grad_norm > 0) or restore the folder")


def save_drafter(module: nn.Module, config: HeadConfig, out_dir: str | Path) -> Path:
    """Write model.safetensors (contiguous CPU tensors, native names), checksums.json and config.json, each
    whole or not at all, config.json last (it marks the folder); non-finite weights are refused."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    state = {name: t.detach().to("cpu").contiguous() for name, t in module.state_dict().items()}
    check_finite(state, out)
    # one metadata key: safetensors writes metadata from a hash map, so two keys come in either order and the same
    # weights would not be the same bytes (config.json records the method)
    write_weights(state, out, metadata={"format": "pt"})
    write_text_atomic(out / CONFIG_NAME, json.dumps(config.to_dict(), indent=2, sort_keys=True) + "\n")
    return out


def write_weights(state: dict[str, torch.Tensor], folder: Path, *, metadata: dict[str, str]) -> Path:
    """folder/model.safetensors whole or not at all, then checksums.json with its sha256 and size (what
    verify_weights checks). Serialized in memory and written by Python, so a full disk is a clear error."""
    weights = folder / WEIGHTS_NAME
    with atomic_path(weights) as tmp:
        tmp.write_bytes(save({k: v.contiguous() for k, v in state.items()}, metadata=metadata))
    checksums = {WEIGHTS_NAME: {"sha256": sha256_file(weights), "bytes": weights.stat().st_size}}
    write_text_atomic(folder / CHECKSUMS_NAME, json.dumps(checksums, indent=2) + "\n")
    return weights


def _config_data(folder: Path) -> dict | None:
    """config.json as a dict; None when there is none; DrafterFolderError when it is not a JSON object."""
    path = folder / CONFIG_NAME
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise DrafterFolderError(f"{path} is not valid JSON ({' '.join(str(err).split())}): the drafter folder is "
                                 f"damaged; copy or train it again") from None
    if not isinstance(data, dict):
        raise DrafterFolderError(f"{path} holds a JSON {type(data).__name__}, not a drafter config: the drafter "
                                 f"folder is damaged; copy or train it again")
    return data


def is_drafter_folder(path: str | Path) -> bool:
    try:
        data = _config_data(Path(path))
    except DrafterFolderError:
        return False
    return data is not None and FORMAT_KEY in data


def read_config(path: str | Path) -> HeadConfig:
    """The folder's HeadConfig; DrafterFolderError when it is not a drafter folder or its config.json is damaged."""
    folder = Path(path)
    data = _config_data(folder)
    if data is None or FORMAT_KEY not in data:
        raise DrafterFolderError(f"{folder} is not a draftsmith drafter folder (no config.json with "
                                 f"a {FORMAT_KEY!r} entry); train one with `draftsmith train`")
    version = data[FORMAT_KEY]
    if not isinstance(version, int) or isinstance(version, bool):
        raise DrafterFolderError(f"{folder / CONFIG_NAME}: {FORMAT_KEY}={version!r} is not a format version: the "
                                 f"drafter folder is damaged; copy or train it again")
    if version > FORMAT_VERSION:
        raise DrafterFolderError(f"{folder} was written in drafter format {version}; this draftsmith "
                                 f"reads up to {FORMAT_VERSION}: upgrade draftsmith")
    if version == 1:  # the target family's layer: Llama and Mistral heads convert exactly, others are refused
        data = upgrade_v1(data, source=str(folder))
    return HeadConfig.from_dict(data, source=folder / CONFIG_NAME)


def verify_weights(folder: str | Path) -> Path:
    """The weights file, checked against checksums.json when the folder has one (size, then sha256)."""
    folder = Path(folder)
    weights = folder / WEIGHTS_NAME
    if not weights.is_file():
        raise DrafterFolderError(f"{folder} has no {WEIGHTS_NAME}: the drafter folder is incomplete; copy or train "
                                 f"it again")
    if not (folder / CHECKSUMS_NAME).is_file():
        return weights  # written before draftsmith recorded checksums: nothing to check against
    try:
        recorded = json.loads((folder / CHECKSUMS_NAME).read_text())[WEIGHTS_NAME]
        size, digest = int(recorded["bytes"]), str(recorded["sha256"])
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError):
        raise DrafterFolderError(f"{folder / CHECKSUMS_NAME} is damaged: copy or train the drafter again (or delete "
                                 f"that file to load the weights unchecked)") from None
    actual = weights.stat().st_size
    if actual != size:
        raise DrafterFolderError(f"{weights} is {actual} bytes but was written as {size} (a truncated or partial "
                                 f"copy?): copy or train the drafter again")
    if sha256_file(weights) != digest:
        raise DrafterFolderError(f"{weights} has changed since it was written (its sha256 differs from "
                                 f"{CHECKSUMS_NAME}: corrupted in place, or edited): copy or train the drafter again, "
                                 f"or delete {CHECKSUMS_NAME} if the edit was deliberate")
    return weights


def load_head(path: str | Path, *, device: str | torch.device = "cpu",
              dtype: torch.dtype = torch.float32) -> nn.Module:
    """The head module with its trained weights (strict: every stored tensor and no other), checked against the
    folder's checksums and for non-finite values."""
    config = read_config(path)
    weights = verify_weights(path)
    try:
        state = load_file(str(weights))
    except (SafetensorError, OSError) as err:
        raise DrafterFolderError(f"{weights} cannot be read as safetensors ({' '.join(str(err).split())}): the "
                                 f"file is damaged (a truncated copy?); copy or train the drafter again") from None
    check_finite(state, weights)
    head = build_head(config)
    try:
        missing, unexpected = head.load_state_dict(state, strict=False)
    except RuntimeError as err:  # a tensor of another shape than config.json describes
        raise DrafterFolderError(f"drafter weights in {path} do not match its config.json ({_mismatches(err)}): "
                                 f"the folder is damaged or mixed from two drafters; copy or train it again") from None
    if missing or unexpected:
        raise DrafterFolderError(f"drafter weights in {path} do not match its {config.method} config: missing "
                                 f"{sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}")
    head.to(device=device, dtype=dtype)  # floating tensors only; d2t/t2d keep their integer/bool types
    return head


def _mismatches(err: RuntimeError) -> str:
    """torch's size-mismatch report, shortened to `name [stored shape] != [configured shape]`."""
    found = re.findall(r"size mismatch for (\S+): copying a param with shape torch.Size\((\[[^\]]*\])\) from "
                       r"checkpoint, the shape in current model is torch.Size\((\[[^\]]*\])\)", str(err))
    if not found:
        return " ".join(str(err).split())[:200]
    shown = "; ".join(f"{name} {stored} in the weights, {wanted} by config.json" for name, stored, wanted in found[:2])
    return shown + (f"; {len(found) - 2} more" if len(found) > 2 else "")


def load_drafter(path: str | Path, target: Target, **opts):
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
