"""A base model's multi-turn prompts, rendered as it was trained and as evaluation used to: μ side by side.

A target without a chat template is trained on the plain text of every turn (data build, serve/core/prompts.py).
Evaluation used to give it the last user turn alone; it now renders the same text it trained on. For every held-out
prompt with more than one user turn (MT-bench `turns` rows get the target's own greedy answers to their earlier
turns first, as data build writes them), both renderings run through one drafter in the same process, interleaved
per prompt, each checked token-identical to plain greedy decoding of its own rendering; μ per prompt and the mean of
each, with their ratio.

    python -m draftsmith.bench.base_render --target demo:gemma3-270m \\
        --drafter runs/demo-gemma3-270m/eagle3/drafter --prompts runs/demo-gemma3-270m/prompts_eval.jsonl --threads 1
"""
from __future__ import annotations

import argparse
import statistics

import torch

from draftsmith.data.prompts import read_prompts
from draftsmith.eval.prompts import prompt_messages
from draftsmith.serve.core.prompts import encode_prompt, render_prompt
from draftsmith.serve.core.target import Target, load_configured
from draftsmith.serve.core.target_config import TargetConfig
from draftsmith.serve.decoding import plain_generate, speculative_generate
from draftsmith.serve.drafters import build_drafter


def renderings(tokenizer, messages) -> dict[str, list[int]]:
    """`last turn`: the last user turn's raw text (evaluation before); `every turn`: the one renderer."""
    convo = prompt_messages(messages)
    return {"last turn": encode_prompt(tokenizer, convo[-1]["content"], chat=False),
            "every turn": render_prompt(tokenizer, convo, chat=False)}


def answered(target: Target, messages: list[dict], *, max_new_tokens: int) -> list[dict]:
    """`messages` with the target's own greedy answer after every user turn but the last that has none."""
    out: list[dict] = []
    for j, message in enumerate(messages):
        out.append(message)
        last = j == len(messages) - 1
        if message["role"] == "user" and not last and messages[j + 1]["role"] == "user":
            prompt = torch.tensor([render_prompt(target.tokenizer, out, chat=False)])  # (1, T)
            ids = plain_generate(target, prompt, max_new_tokens=max_new_tokens).output_ids
            out.append({"role": "assistant", "content": target.tokenizer.decode(ids, skip_special_tokens=True)})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="demo:gemma3-270m")
    parser.add_argument("--drafter", required=True, help="a drafter spec (a trained folder)")
    parser.add_argument("--prompts", required=True, help="held-out prompts (JSONL) the drafter never trained on")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--limit", type=int, default=0, help="multi-turn prompts measured; 0 = all")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    target = load_configured(TargetConfig(spec=args.target, dtype=args.dtype, threads=args.threads))
    drafter = build_drafter(args.drafter, target)
    rows = [r for r in read_prompts([args.prompts]) if sum(m["role"] == "user" for m in r.messages) > 1]
    rows = rows[: args.limit] if args.limit else rows
    if not rows:
        raise SystemExit(f"base_render: {args.prompts} holds no prompt with more than one user turn")
    mus: dict[str, list[float]] = {"last turn": [], "every turn": []}
    for row in rows:
        line = [f"{row.id:<28}"]
        messages = answered(target, list(row.messages), max_new_tokens=args.max_new_tokens)
        for name, ids in renderings(target.tokenizer, messages).items():
            prompt = torch.tensor([ids])  # (1, T)
            plain = plain_generate(target, prompt, max_new_tokens=args.max_new_tokens).output_ids
            out = speculative_generate(target, drafter, prompt, max_new_tokens=args.max_new_tokens)
            if out.output_ids != plain:
                raise SystemExit(f"base_render: {row.id} ({name}) differs from plain greedy decoding")
            mus[name].append(out.stats.mu)
            line.append(f"{name}: {len(ids):>4} tokens, mu {out.stats.mu:.2f}")
        print("  ".join(line), flush=True)
    old, new = statistics.mean(mus["last turn"]), statistics.mean(mus["every turn"])
    print(f"\n{len(rows)} multi-turn prompts, {args.max_new_tokens} new tokens, {args.dtype}, {args.threads} "
          f"thread(s); every output identical to plain greedy decoding of its rendering")
    print(f"mean mu: last turn {old:.3f}, every turn {new:.3f}: {new / old:.3f}x")


if __name__ == "__main__":
    main()
