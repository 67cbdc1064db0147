"""`draftsmith generate`: live speculative generation of one prompt, streamed, with a stats line."""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from typing import ClassVar, Optional

from draftsmith.serve.core.errors import ConfigError
from draftsmith.serve.core.files import check_output_path, write_text_atomic
from draftsmith.serve.core.target_config import TargetConfig
from draftsmith.serve.core.threads import THREADS_HELP


@dataclass
class GenerateConfig:
    """`draftsmith generate`'s settings (`--config FILE.yaml` reads its `generate:` section, or the whole file)."""
    ALIASES: ClassVar[dict[str, str]] = {"dtype": "target.dtype", "device": "target.device",
                                         "threads": "target.threads", "target": "target.spec"}
    RANGES: ClassVar[dict[str, str]] = {"k": ">= 1", "temperature": ">= 0", "top_k": ">= 0", "top_p": "(0, 1]",
                                        "max_new_tokens": ">= 1", "seed": ">= 0"}
    target: TargetConfig = field(default_factory=TargetConfig)  # `--target` sets target.spec
    drafter: str = "ngram"  # a drafter spec (serve/drafters/spec.py)
    prompt: str = ""
    chat: bool = False  # wrap the prompt in the target's chat template
    k: Optional[int] = None  # draft tokens per cycle; default: the K the drafter folder records, else 5
    tree: Optional[bool] = None  # tree drafting; default: what the drafter folder records
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    max_new_tokens: int = 128
    seed: Optional[int] = None
    stop: list[str] = field(default_factory=list)  # stop strings

    def validate(self) -> None:
        self.target.validate()
        if not self.prompt:
            raise ConfigError("generate needs a prompt: --prompt TEXT (or prompt=... in the config)")


def add_arguments(parser) -> None:
    # Flags left unset keep the value from --config / key=value overrides (section `generate`).
    parser.add_argument("--target", default=None, help="HF folder, .gguf file, hub id, or `demo` (default)")
    parser.add_argument("--drafter", default=None, help="ngram | ngram:max_n=8 | oracle | model:PATH | mtp (the "
                        "target's own MTP layer) | drafter folder (DIR, DIR:min_confidence=0.3, DIR@tree) | "
                        "hybrid:DIR; the draft length is chosen "
                        "per step unless SPEC:length=fixed; default ngram")
    parser.add_argument("--prompt", default=None)
    parser.add_argument("--chat", action="store_true", default=None,
                        help="wrap the prompt in the target's chat template")
    parser.add_argument("--k", type=int, default=None,
                        help="draft tokens per cycle (default: the K the drafter folder records, else 5; at most, "
                             "unless length=fixed)")
    parser.add_argument("--temperature", type=float, default=None, help="default 0 (greedy)")
    parser.add_argument("--top-k", type=int, default=None)
    parser.add_argument("--top-p", type=float, default=None)
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default 128")
    parser.add_argument("--seed", type=int, default=None,
                        help="sample reproducibly: the same seed gives the same text with or without a drafter")
    parser.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    parser.add_argument("--tree", action=argparse.BooleanOptionalAction, default=None,
                        help="tree drafting (EAGLE / Medusa folders; default: what the folder records)")
    parser.add_argument("--dtype", default=None, help="target compute dtype (default float32; = target.dtype)")
    parser.add_argument("--threads", type=int, default=None, help=THREADS_HELP)
    parser.add_argument("--json", default=None, help="write prompt/output token ids and stats here")
    parser.add_argument("--quiet", action="store_true", help="do not stream the text")


class _Streamer:
    """Prints text as tokens are accepted, decoding the whole output so multi-byte characters come out whole."""

    def __init__(self, tokenizer, out):
        self.tokenizer, self.out, self.ids, self.shown = tokenizer, out, [], ""

    def __call__(self, tokens):
        self.ids.extend(tokens)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):
            return
        self.out.write(text[len(self.shown):])
        self.out.flush()
        self.shown = text


def run(args) -> int:
    import torch

    from draftsmith.serve.core.config import load_config
    from draftsmith.serve.decoding import speculative_generate
    from draftsmith.serve.drafters import build_drafter
    from draftsmith.serve.drafters.settings import draft_settings
    from draftsmith.serve.core.prompts import encode_prompt

    flags = {"target.spec": args.target, "target.dtype": args.dtype, "target.threads": args.threads,
             **{name: getattr(args, name) for name in ("drafter", "prompt", "chat", "k", "tree", "temperature",
                                                      "top_k", "top_p", "max_new_tokens", "seed", "stop")}}
    config = load_config(GenerateConfig, config_file=args.config, section="generate", overrides=args.overrides,
                         flags=flags)
    if args.json:
        check_output_path(args.json, what="--json file")
    config.target.apply_threads()
    from draftsmith.serve.core.target import load_configured
    from draftsmith.serve.drafters.early import check_before_loading

    check_before_loading([config.drafter], config.target.spec)  # a missing or mismatched drafter: before the load
    target = load_configured(config.target, require_chat_template=config.chat)
    drafter = build_drafter(config.drafter, target)
    settings = draft_settings(drafter, k=config.k, tree=config.tree)
    input_ids = torch.tensor([encode_prompt(target.tokenizer, config.prompt, chat=config.chat)])  # (1, T)
    streamer = None if args.quiet else _Streamer(target.tokenizer, sys.stdout)
    result = speculative_generate(target, drafter, input_ids, max_new_tokens=config.max_new_tokens, k=settings.k,
                                  temperature=config.temperature, top_k=config.top_k, top_p=config.top_p,
                                  seed=config.seed, stop_strings=tuple(config.stop), tree=settings.tree,
                                  on_tokens=streamer)
    stats = result.stats
    accept = " ".join(f"{a:.2f}" for a in stats.acceptance_by_position)
    drafted = sum(stats.drafted_per_cycle) / max(1, len(stats.drafted_per_cycle))
    print(f"\n[draftsmith] drafter={config.drafter} k={settings.k} mu={stats.mu:.2f} drafted/cycle={drafted:.2f} "
          f"tokens={stats.new_tokens} "
          f"target_forwards={stats.target_forwards} tok/s={stats.new_tokens / stats.seconds:.1f} "
          f"draft={stats.draft_seconds:.2f}s verify={stats.verify_seconds:.2f}s acceptance_by_position=[{accept}]",
          file=sys.stderr)
    if args.json:
        record = {"prompt_token_ids": input_ids[0].tolist(), "output_token_ids": result.output_ids,
                  "text": target.tokenizer.decode(result.output_ids, skip_special_tokens=True),
                  "settings": {"target": config.target.spec, "drafter": config.drafter,
                               **{k: getattr(config, k) for k in ("temperature", "top_k", "top_p", "max_new_tokens",
                                                                  "seed")},
                               **settings.describe(), "min_confidence": getattr(drafter, "min_confidence", None)},
                  **stats.to_dict()}
        write_text_atomic(args.json, json.dumps(record, indent=1))
    return 0
