"""Fingerprints of a target: which model and which tokenizer a drafter or a cache was made for."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

# Config fields that do not change what the model computes: left out of the hash.
_VOLATILE = {"_name_or_path", "transformers_version", "torch_dtype", "dtype", "architectures",
             "use_cache", "_attn_implementation", "_attn_implementation_autoset", "quantization_config",
             "output_hidden_states", "output_attentions", "return_dict", "_commit_hash", "name_or_path",
             "distributed_config"}


def config_hash(config: Any) -> str:
    """sha256 (16 hex) of the architecture fields of an HF config (a PretrainedConfig or its dict)."""
    data = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    kept = {k: v for k, v in sorted(data.items()) if k not in _VOLATILE and not k.startswith("_")}
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()[:16]


def tokenizer_hash(tokenizer: Any) -> str:
    """sha256 (16 hex) of the vocabulary (token -> id) and the special tokens: equal iff ids mean the same."""
    vocab = tokenizer.get_vocab()
    special = {k: str(v) for k, v in sorted(tokenizer.special_tokens_map.items())}
    payload = json.dumps({"vocab": sorted(vocab.items(), key=lambda kv: kv[1]), "special": special},
                         ensure_ascii=False)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def sha256_file(path: str | Path) -> str:
    """sha256 (hex) of a file's bytes, read in 4 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".json")
SAMPLE = 1 << 20  # bytes read at the start, middle and end of each weight file


def files_fingerprint(folder: str | Path, *, sample: int = SAMPLE,
                      suffixes: tuple[str, ...] = WEIGHT_SUFFIXES) -> str:
    """sha256 (16 hex) of a model folder's weight and config files (or of one file): names, sizes, and the bytes at
    the start (the safetensors header), middle and end of each. Reads ~3 MiB a file, so launches of a 70B target can
    compare copies on every node before loading; two copies that differ only elsewhere compare equal (sha256_file
    reads all of it)."""
    digest = hashlib.sha256()
    root = Path(folder)
    files = [root] if root.is_file() else sorted(p for p in root.iterdir() if p.is_file() and p.suffix in suffixes)
    for path in files:
        size = path.stat().st_size
        digest.update(f"{path.name}\0{size}\0".encode())
        with open(path, "rb") as fh:
            for offset in sorted({0, max(size // 2 - sample // 2, 0), max(size - sample, 0)}):
                fh.seek(offset)
                digest.update(fh.read(sample))
    return digest.hexdigest()[:16]


def weights_fingerprint(path: str | Path) -> str:
    """files_fingerprint of a target's weights alone (a folder's *.safetensors / *.bin / *.gguf, or one .gguf
    file): equal for copies of one model, different for a fine-tune of it, whose config and tokenizer hashes may
    equal the base's. "" when `path` is not on this machine (a hub id)."""
    where = Path(path)
    if not where.exists():
        return ""
    return files_fingerprint(where, suffixes=(".safetensors", ".bin", ".gguf"))
