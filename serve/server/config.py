"""The server's typed config (`draftsmith serve --config FILE.yaml` reads its `serve:` section, or the whole file)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Optional

from draftsmith.serve.core.ranges import check_ranges
from draftsmith.serve.core.target_config import TargetConfig


@dataclass
class TreeOptions:
    """Tree drafting (EAGLE-2 style dynamic tree) for drafters that support it; off = a chain of k.
    Unset values are what the drafter folder records (serve/drafters/settings.py), else chains / 5, 4, 24."""
    RANGES: ClassVar[dict[str, str]] = {"depth": ">= 1", "top_k": ">= 1", "total_tokens": ">= 1"}
    enabled: Optional[bool] = None
    depth: Optional[int] = None
    top_k: Optional[int] = None
    total_tokens: Optional[int] = None


@dataclass
class ServeConfig:
    # the flat spellings of earlier versions keep working (draftsmith.serve.core.config.load_config)
    ALIASES: ClassVar[dict[str, str]] = {"dtype": "target.dtype", "device": "target.device",
                                         "threads": "target.threads", "target": "target.spec"}
    RANGES: ClassVar[dict[str, str]] = {"k": ">= 1", "port": "[0, 65535]", "context_length": ">= 2",
                                        "max_queue": ">= 1", "max_batch": ">= 1", "max_body_mb": "> 0",
                                        "max_prompt_chars": ">= 1", "record_segment_mb": "> 0",
                                        "drain_seconds": ">= 0", "keep_cache_mb": ">= 0"}
    target: TargetConfig = field(default_factory=TargetConfig)  # `--target` sets target.spec
    drafter: str = "ngram"  # ngram[:max_n=8], model:PATH, oracle, a trained drafter folder, or hybrid:DIR
    # draft tokens per cycle (at most: the length is chosen per step unless SPEC:length=fixed); default: the K
    # the drafter folder records, else 5
    k: Optional[int] = None
    tree: TreeOptions = field(default_factory=TreeOptions)
    speculation: bool = True  # false: plain decoding (the baseline to compare against)
    host: str = "127.0.0.1"
    port: int = 8000
    # the `model` id /v1/models lists and responses carry; default: the target's short name (its folder or hub
    # repository name). Requests may also name the target as given (its path or hub id).
    served_model_name: Optional[str] = None
    context_length: Optional[int] = None  # default: the target's max_position_embeddings
    # requests decoding together (continuous batching: a request joins at the next step, leaves when it ends);
    # 1: one request at a time
    max_batch: int = 8
    # live requests waiting for a slot beyond this get a 503 with Retry-After (a client that left frees its place)
    max_queue: int = 64
    # on SIGTERM / Ctrl+C, the seconds running and queued requests get to finish; then they are cancelled, each client
    # answered with an error (a 503, or an error event on a stream)
    drain_seconds: float = 30.0
    # once no request is decoding, a KV slot cache larger than this (grown for a long request) is freed and its memory
    # given back to the system; the next request allocates one of its own size (0: free it after every request)
    keep_cache_mb: float = 256.0
    # a larger request body gets a 413 while it arrives (serve.server.limits); a full 128k-token context of English
    # text is about 0.5 MB of JSON
    max_body_mb: float = 4.0
    # a longer prompt (characters, before tokenizing) gets a 400; default: the vocabulary's longest entry times the
    # context length, the most characters a prompt that fits could have
    max_prompt_chars: Optional[int] = None
    record: Optional[str] = None  # folder that keeps every answered request (draftsmith.serve.core.traffic); None: off
    record_segment_mb: float = 64.0  # a new traffic-NNNNN.jsonl segment starts beyond this size
    log_level: str = "info"

    def validate(self) -> None:
        check_ranges(self)  # the RANGES above, tree's and target's; every float finite
        self.target.validate()
