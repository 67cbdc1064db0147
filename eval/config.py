"""The typed config of an evaluation run (`draftsmith eval`, the `eval:` section of a recipe)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Optional

from draftsmith.eval.sweep_axes import parse_sweeps
from draftsmith.serve.core.ranges import check_ranges
from draftsmith.serve.core.target_config import TargetConfig


@dataclass
class EvalConfig:
    # the spellings of earlier versions keep working (draftsmith.serve.core.config.load_config)
    ALIASES: ClassVar[dict[str, str]] = {"dtype": "target.dtype", "device": "target.device",
                                         "threads": "target.threads", "target": "target.spec",
                                         "limit": "per_domain_limit"}
    RANGES: ClassVar[dict[str, str]] = {"k": ">= 1", "temperature": ">= 0", "top_k": ">= 0", "top_p": "(0, 1]",
                                        "max_new_tokens": ">= 1", "seed": ">= 0", "per_domain_limit": ">= 1",
                                        "repeats": ">= 1",
                                        "bootstrap_samples": ">= 1", "ci_level": "(0, 1)",
                                        "cost_context_tokens": ">= 1", "cost_repeats": ">= 1", "cost_ks": ">= 1"}
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
    warmup: bool = True  # one short untimed run of every method before timing, and of plain decoding per prompt
    # each method runs this many times per prompt (interleaved: every method once, then again); its fastest run
    # is kept, the machine's interference is what the others add. `--repeats`
    repeats: int = 1
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
        check_ranges(self)  # every number finite and in its range (RANGES)
        self.target.validate()
        parse_sweeps(self.sweep)
