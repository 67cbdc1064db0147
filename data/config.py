"""Typed configs of the data pipeline: section `data` (build) and `capture` of a recipe (configs/data/*.yaml).

One recipe file can hold both sections; on the command line an override may carry the section's name
(`data.max_new_tokens=64`, `capture.rows_per_shard=128`). Both embed the target's section (`target.dtype`, ...).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Optional

from draftsmith.serve.core.errors import ConfigError
from draftsmith.serve.core.ranges import check_ranges
from draftsmith.serve.core.target_config import TargetConfig

LONG_PROMPT_POLICIES = ("skip", "truncate")


@dataclass
class EndpointConfig:
    """An OpenAI-compatible server that writes the answers instead of an in-process target (data.endpoint)."""
    RANGES: ClassVar[dict[str, str]] = {"concurrency": ">= 1", "timeout": "> 0", "retries": ">= 0", "backoff": ">= 0",
                                        "max_backoff": ">= 0"}
    url: Optional[str] = None  # e.g. http://127.0.0.1:8000 (vLLM, SGLang, draftsmith serve); None: in process
    model: Optional[str] = None  # the served model id to use (default: the one named like the target)
    concurrency: int = 8  # requests in flight
    timeout: float = 600.0  # seconds per request before it is retried
    retries: int = 6  # per request, on 429 / 5xx / lost connections / timeouts, with exponential back-off
    backoff: float = 1.0  # seconds before the first retry; doubled each time up to max_backoff
    max_backoff: float = 60.0
    api_key_env: str = "OPENAI_API_KEY"  # environment variable holding the server's API key, if it needs one


@dataclass
class DataBuildConfig:
    """Self-distillation: the target answers every prompt; the answers become the training data."""
    # the spellings of earlier versions keep working (draftsmith.serve.core.config.load_config)
    ALIASES: ClassVar[dict[str, str]] = {"target": "target.spec", "dtype": "target.dtype", "device": "target.device"}
    RANGES: ClassVar[dict[str, str]] = {"limit": ">= 1", "per_domain_limit": ">= 1", "keep_answers": "[0, 1]",
                                        "max_new_tokens": ">= 1", "temperature": ">= 0", "top_k": ">= 0",
                                        "top_p": "(0, 1]", "seed": ">= 0", "batch_size": ">= 1", "max_length": ">= 2",
                                        "draft_vocab_size": ">= 1"}
    target: TargetConfig = field(default_factory=TargetConfig)  # `--target` sets target.spec
    prompts: list[str] = field(default_factory=lambda: ["builtin"])  # sources for data.prompts.load_prompts
    domain_field: str = "domain"
    split: str = "train"  # split of an HF datasets source
    limit: Optional[int] = None  # first N rows of each source
    per_domain_limit: Optional[int] = None  # then the first N rows of each domain
    chat: bool = True  # render with the target's chat template; false: plain prompt + completion (base models)
    regenerate: bool = True  # the target rewrites assistant turns a row already has (false: keep them)
    keep_answers: float = 0.0  # with regenerate: this fraction of the rows that carry answers keeps them as written
    max_new_tokens: int = 256  # per generated assistant turn
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0
    seed: int = 0  # sampling seed; each answer draws from (seed, row id, turn): a resumed build draws the same tokens
    batch_size: int = 32  # rows decoding at once (longest prompts first; a finished row hands its slot on)
    max_length: int = 2048  # tokens per conversation, capped by the target's context
    long_prompts: str = "skip"  # a prompt leaving < max_new_tokens of room: skip | truncate (its longest turn)
    drop_unfinished: bool = False  # drop rows whose last answer hit max_new_tokens before EOS
    draft_vocab_size: Optional[int] = None  # report the loss-token coverage of a draft vocabulary of this size
    server: EndpointConfig = field(default_factory=EndpointConfig)  # `--server URL`: generate through a server
    traffic: list[str] = field(default_factory=list)  # `serve --record` folders: their answers join as served

    def validate(self) -> None:
        validate(self)


@dataclass
class CaptureConfig:
    """Hidden-state capture for offline training."""
    # `dtype` was the storage dtype here while it is the compute dtype everywhere else: now `storage_dtype`, with
    # the compute dtype in target.dtype; the old spellings keep working (draftsmith.serve.core.config.load_config)
    ALIASES: ClassVar[dict[str, str]] = {"target": "target.spec", "dtype": "storage_dtype",
                                         "target_dtype": "target.dtype", "device": "target.device"}
    RANGES: ClassVar[dict[str, str]] = {"batch_tokens": ">= 1", "rows_per_shard": ">= 1", "max_length": ">= 2",
                                        "disk_headroom_gib": ">= 0"}
    target: TargetConfig = field(default_factory=TargetConfig)  # `--target` sets target.spec; device auto = this
    # rank's device (cuda when available, else cpu)
    layers: str = "eagle3"  # eagle3 | eagle1 | medusa | comma-separated layer ids (-1 = FINAL)
    storage_dtype: str = "bf16"  # the cache's dtype: bf16 | fp16 | fp32
    batch_tokens: int = 4096  # padded tokens per forward
    rows_per_shard: int = 128  # a shard is built in memory: rows x tokens x stored layers x h x dtype bytes
    max_length: Optional[int] = None  # truncate longer rows (default: the target's context)
    disk_headroom_gib: float = 0.5  # refuse unless this much stays free after the estimated cache
    allow_other_target: bool = False  # capture a dataset built for another target of the same tokenizer and hidden
    # size (a fine-tune of it); `--allow-other-target`

    def validate(self) -> None:
        validate(self)

    # Read by data/capture.py under their earlier names.
    @property
    def dtype(self) -> str:
        return self.storage_dtype

    @property
    def target_dtype(self) -> str:
        return self.target.dtype

    @property
    def device(self) -> str:
        return self.target.device


def validate(config) -> None:
    """Value checks OmegaConf's type checks cannot express; ConfigError names the key."""
    section = "data" if isinstance(config, DataBuildConfig) else "capture"
    check_ranges(config, prefix=f"{section}.")  # every number finite and in its range (the RANGES above)
    config.target.validate(key=f"{section}.target")
    if isinstance(config, DataBuildConfig):
        if config.long_prompts not in LONG_PROMPT_POLICIES:
            raise ConfigError(f"data.long_prompts must be one of {', '.join(LONG_PROMPT_POLICIES)}, "
                              f"got {config.long_prompts!r}")
        if config.max_new_tokens >= config.max_length:
            raise ConfigError(f"data.max_new_tokens ({config.max_new_tokens}) must be below data.max_length "
                              f"({config.max_length}) to leave room for the prompt")
        if not config.prompts:
            raise ConfigError("data.prompts is empty: name at least one prompt source (e.g. builtin)")
