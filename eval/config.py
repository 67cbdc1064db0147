"""The typed config of an evaluation run (`draftsmith eval`, the `eval:` section of a recipe)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Optional

from serve.errors import ConfigError
from serve.target_config import TargetConfig


@dataclass
class EvalConfig:
    # the spellings of earlier versions keep working (serve.config.load_config)
    ALIASES: ClassVar[dict[str, str]] = {"dtype": "target.dtype", "device": "target.device",
                                         "threads": "target.threads", "target": "target.spec",
                                         "limit": "per_domain_limit"}
    target: TargetConfig = field(default_factory=TargetConfig)  # `--target` sets target.spec
    # decoding, the same for plain decoding, every drafter and every peer
    k: Optional[int] = None  # draft tokens per cycle; default: the K the drafter folders record (they agree), else 5
    temperature: float = 0.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0
    max_new_tokens: int = 128
    seed: int = 0  # prompt i is sampled with seed + i, identically for every method
    # prompts
    domain_field: str = "domain"
    per_domain_limit: Optional[int] = None  # at most this many prompts per domain (file order); --limit
    # what to run
    peers: bool = True  # transformers' assisted generation in the same run
    hf_plain: bool = True  # transformers' plain generate too (what the peers' speedups are relative to)
    cost_model: bool = True  # measure c and verify ratios, fit the cost model
    warmup: bool = True  # one short untimed run of every method before timing
    sweep: list[str] = field(default_factory=list)  # e.g. ["k=1,2,3,5,8", "temperature=0,0.7,1.0"]
    # statistics
    bootstrap_samples: int = 1000
    ci_level: float = 0.95
    # cost-model measurement
    cost_context_tokens: int = 256
    cost_repeats: int = 5
    cost_ks: list[int] = field(default_factory=lambda: [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16])
    progress: bool = True

    def validate(self) -> None:
        self.target.validate()
        for key in ("k", "max_new_tokens", "per_domain_limit", "bootstrap_samples", "cost_repeats"):
            value = getattr(self, key)
            if value is not None and value < 1:
                raise ConfigError(f"{key} must be at least 1, got {value}")
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.top_k < 0 or not 0 < self.ci_level < 1:
            raise ConfigError("temperature >= 0, top_p in (0, 1], top_k >= 0 and ci_level in (0, 1) are required")
        from eval.sweeps import parse_sweeps

        parse_sweeps(self.sweep)
