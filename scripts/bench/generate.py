"""Self-distillation generation on the default target: static batches against continuous batching.

    .venv/bin/python scripts/bench/generate.py [--per-domain 0] [--max-new-tokens 256] [--batch-size 32]
        [--slots 32,64] [--bf16-slots 256] [--json runs/bench_generate.json]

Same prompts (the built-in sets rendered as `data build` renders them, longest first), one process, torch
pinned to --threads: static batching, the baseline (`former_*` in the output: transformers' `generate` on
left-padded batches of --batch-size, each running until its longest answer ends), against
`data.generate.ContinuousBatcher` at each --slots, both at temperature 0.
Reports generated tokens/s, the rows whose tokens differ from the baseline's, and the teacher-forced forward
throughput over the generated rows (what a capture pass costs). --bf16-slots also runs the batcher with the
target in bf16 and counts the tokens that differ from fp32 greedy (bf16 changes the target's greedy output).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: the target's module imports torch
    from draftsmith.serve.core.target import Target


def former_generate(target: Target, prompts, *, batch_size: int, max_new_tokens: int) -> list[list[int]]:
    """Static batching, the baseline: one `generate` call per left-padded batch, each batch decoding until its
    longest answer ends."""
    import torch
    from transformers import GenerationConfig

    from draftsmith.eval.batch_runner import left_pad

    eos = target.eos_token_ids
    pad = target.tokenizer.pad_token_id if target.tokenizer.pad_token_id is not None else eos[0]
    config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos, pad_token_id=pad)
    answers = []
    for start in range(0, len(prompts), batch_size):
        input_ids, attention_mask = left_pad(prompts[start:start + batch_size], pad)
        width = input_ids.shape[1]
        with torch.inference_mode():
            out = target.model.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=config)
        for row in out[:, width:].tolist():
            cut = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
            answers.append(row[:cut])
    return answers


def continuous_generate(target: Target, prompts, *, slots: int, max_new_tokens: int) -> list[list[int]]:
    from draftsmith.data.generate import ContinuousBatcher, Request

    batcher = ContinuousBatcher(target, slots=slots, max_new_tokens=max_new_tokens)
    for i, prompt in enumerate(prompts):
        batcher.add(Request(key=i, prompt=prompt))
    answers = {}
    while batcher.busy:
        for request, answer in batcher.step():
            answers[request.key] = answer.token_ids
    return [answers[i] for i in range(len(prompts))]


def build_prompts(target: Target, per_domain: int | None) -> list[list[int]]:
    """The built-in prompts (the first `per_domain` of each domain, None: all) rendered as `data build` renders
    them, longest first (the build's order)."""
    from draftsmith.data.build import gather_prompts
    from draftsmith.data.config import DataBuildConfig
    from draftsmith.data.masks import render_prompt
    from draftsmith.data.plan import plan_conversation

    prompts = []
    for row in gather_prompts(DataBuildConfig(per_domain_limit=per_domain)):
        conversation = plan_conversation(row, regenerate=True)
        prompts.append(render_prompt(target.tokenizer, conversation.messages[:conversation.next_slot()], chat=True))
    return sorted(prompts, key=len, reverse=True)


def teacher_forced(target: Target, rows, *, batch_tokens: int = 4096) -> float:
    """Seconds for one forward over every row (right-padded batches of about batch_tokens), logits included."""
    import torch

    from draftsmith.data.capture import plan_batches, right_pad

    pad = target.tokenizer.pad_token_id or 0
    start = time.perf_counter()
    with torch.inference_mode():
        for batch in plan_batches([len(r) for r in rows], batch_tokens):
            input_ids, attention_mask = right_pad([rows[i] for i in batch], pad)
            target.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    return time.perf_counter() - start


def differing(reference: list[list[int]], other: list[list[int]]) -> dict:
    rows = [i for i, (a, b) in enumerate(zip(reference, other)) if a != b]
    # tokens from the first difference on, per row (after a difference the rest of the answer is another text)
    tokens = sum(max(len(reference[i]), len(other[i])) - next(
        (k for k, (x, y) in enumerate(zip(reference[i], other[i])) if x != y), min(len(reference[i]), len(other[i])))
        for i in rows)
    return {"rows": len(rows), "tokens_after_first_difference": tokens,
            "first_difference_at": [next((k for k, (x, y) in enumerate(zip(reference[i], other[i])) if x != y),
                                          min(len(reference[i]), len(other[i]))) for i in rows]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="demo")
    parser.add_argument("--per-domain", type=int, default=0, help="first N built-in prompts per domain (0: all)")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=32, help="batch of the former path")
    parser.add_argument("--slots", default="32", help="comma-separated slot counts of the continuous batcher")
    parser.add_argument("--bf16-slots", type=int, default=0, help="also run bf16 with this many slots (0: no)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    import torch

    from draftsmith.serve.core.target import load_target

    torch.set_num_threads(args.threads)
    target = load_target(args.target)
    prompts = build_prompts(target, args.per_domain or None)
    figures = {"target": target.name, "prompts": len(prompts), "prompt_tokens": sum(map(len, prompts)),
               "max_new_tokens": args.max_new_tokens, "threads": args.threads, "load_before": os.getloadavg()}

    def timed(name, fn):
        start = time.perf_counter()
        answers = fn()
        seconds = time.perf_counter() - start
        tokens = sum(map(len, answers))
        figures[name] = {"seconds": round(seconds, 1), "generated_tokens": tokens,
                         "tokens_per_second": round(tokens / seconds, 2), "load": os.getloadavg()}
        print(f"{name}: {json.dumps(figures[name])}", file=sys.stderr, flush=True)
        return answers

    former = timed(f"former_batch{args.batch_size}", lambda: former_generate(
        target, prompts, batch_size=args.batch_size, max_new_tokens=args.max_new_tokens))
    for slots in [int(s) for s in args.slots.split(",")]:
        answers = timed(f"continuous_slots{slots}", lambda: continuous_generate(
            target, prompts, slots=slots, max_new_tokens=args.max_new_tokens))
        figures[f"continuous_slots{slots}"]["differs_from_former"] = differing(former, answers)
        figures[f"continuous_slots{slots}"]["speedup"] = round(
            figures[f"former_batch{args.batch_size}"]["seconds"] / figures[f"continuous_slots{slots}"]["seconds"], 2)
    full_rows = [p + a for p, a in zip(prompts, former)]
    seconds = teacher_forced(target, full_rows)
    tokens = sum(map(len, full_rows))
    figures["teacher_forced_forward"] = {"seconds": round(seconds, 1), "tokens": tokens,
                                         "tokens_per_second": round(tokens / seconds, 1)}
    if args.bf16_slots:
        target.model.to(torch.bfloat16)
        answers = timed(f"continuous_bf16_slots{args.bf16_slots}", lambda: continuous_generate(
            target, prompts, slots=args.bf16_slots, max_new_tokens=args.max_new_tokens))
        figures[f"continuous_bf16_slots{args.bf16_slots}"]["differs_from_fp32"] = differing(former, answers)
    print(json.dumps(figures, indent=1))
    if args.json:
        from draftsmith.eval.report import write_json

        write_json(figures, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
