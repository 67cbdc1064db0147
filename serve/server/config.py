"""The server's typed config (`draftsmith serve --config FILE.yaml` reads its `serve:` section)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass
class TreeOptions:
    """Tree drafting (EAGLE-2 style dynamic tree) for drafters that support it; off = a chain of k.
    Unset values are what the drafter folder records (serve/drafters/settings.py), else chains / 5, 4, 24."""
    enabled: Optional[bool] = None
    depth: Optional[int] = None
    top_k: Optional[int] = None
    total_tokens: Optional[int] = None


@dataclass
class ServeConfig:
    target: str = "demo"  # HF folder, .gguf file, hub id, or `demo`
    drafter: str = "ngram"  # ngram[:max_n=3], model:PATH, oracle, or a trained drafter folder
    k: Optional[int] = None  # draft tokens per cycle; default: the K the drafter folder records, else 5
    tree: TreeOptions = field(default_factory=TreeOptions)
    speculation: bool = True  # false: plain decoding (the baseline to compare against)
    host: str = "127.0.0.1"
    port: int = 8000
    served_model_name: Optional[str] = None  # the `model` clients send; default: the target's name
    context_length: Optional[int] = None  # default: the target's max_position_embeddings
    dtype: str = "float32"
    device: str = "cpu"
    # torch intra-op threads (default: torch's own choice). On a CPU shared with other work, 1 avoids
    # oversubscribed OpenMP threads that slow multi-token verify forwards far more than 1-token steps.
    threads: Optional[int] = None
    max_queue: int = 64  # requests waiting beyond this get a 503
    log_level: str = "info"
