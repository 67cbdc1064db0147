"""`draftsmith generate`: live speculative generation of one prompt, streamed, with a stats line."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def add_arguments(parser) -> None:
    parser.add_argument("--target", default="demo", help="HF folder, .gguf file, hub id, or `demo`")
    parser.add_argument("--drafter", default="ngram", help="ngram | ngram:max_n=3 | oracle | model:PATH | drafter folder "
                        "(DIR, DIR:min_confidence=0.3, DIR@tree)")
    parser.add_argument("--prompt", required=True)
    parser.add_argument("--chat", action="store_true", help="wrap the prompt in the target's chat template")
    parser.add_argument("--k", type=int, default=None,
                        help="draft tokens per cycle (default: the K the drafter folder records, else 5)")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    parser.add_argument("--tree", action=argparse.BooleanOptionalAction, default=None,
                        help="tree drafting (EAGLE / Medusa folders; default: what the folder records)")
    parser.add_argument("--dtype", default="float32")
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

    from serve.decoding import speculative_generate
    from serve.drafters import build_drafter
    from serve.drafters.settings import draft_settings
    from serve.prompts import encode_prompt
    from serve.target import load_target

    torch.set_num_threads(max(1, torch.get_num_threads()))
    target = load_target(args.target, dtype=args.dtype, require_chat_template=args.chat)
    drafter = build_drafter(args.drafter, target)
    settings = draft_settings(drafter, k=args.k, tree=args.tree)
    input_ids = torch.tensor([encode_prompt(target.tokenizer, args.prompt, chat=args.chat)])  # (1, T)
    streamer = None if args.quiet else _Streamer(target.tokenizer, sys.stdout)
    result = speculative_generate(target, drafter, input_ids, max_new_tokens=args.max_new_tokens, k=settings.k,
                                  temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed,
                                  stop_strings=tuple(args.stop), tree=settings.tree, on_tokens=streamer)
    stats = result.stats
    accept = " ".join(f"{a:.2f}" for a in stats.acceptance_by_position)
    print(f"\n[draftsmith] drafter={args.drafter} k={settings.k} mu={stats.mu:.2f} tokens={stats.new_tokens} "
          f"target_forwards={stats.target_forwards} tok/s={stats.new_tokens / stats.seconds:.1f} "
          f"draft={stats.draft_seconds:.2f}s verify={stats.verify_seconds:.2f}s acceptance_by_position=[{accept}]",
          file=sys.stderr)
    if args.json:
        record = {"prompt_token_ids": input_ids[0].tolist(), "output_token_ids": result.output_ids,
                  "text": target.tokenizer.decode(result.output_ids, skip_special_tokens=True),
                  "settings": {**{k: getattr(args, k) for k in ("target", "drafter", "temperature", "top_k", "top_p",
                                                                 "max_new_tokens", "seed")},
                               **settings.describe(), "min_confidence": getattr(drafter, "min_confidence", None)},
                  **stats.to_dict()}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(record, indent=1))
    return 0
