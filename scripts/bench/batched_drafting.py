"""What drafting one cycle costs a batch of rows: the heads' forwards for all rows together, against row by row.

    .venv/bin/python scripts/bench/batched_drafting.py [--target demo] [--dtype float32] [--k 4] [--rows 1,4,16]
        [--methods eagle3,eagle1,medusa] [--draft-vocab 4096] [--plain-heads] [--sdpa] [--cycles 8] [--threads 1]
        [--json runs/bench_batched_drafting.json]

Per method, freshly initialised heads on the target (their cost does not depend on training) with the demo's draft
vocabulary (--draft-vocab; 0 = the target's whole one; EAGLE-1 always drafts over the target's), per batch size: B
rows forked from one drafter, each begun on its own random 96-token context; then --cycles cycles in which every
row commits its whole last draft and a bonus token (as if all were accepted: a catch-up of K+1 pairs, their target
states drawn before the clock starts) and drafts a chain of K. The same cycles run with the rows drafting together
(serve/drafters/base.py `propose_batch`, the batched decoder's path) and row by row (`Drafter.propose_rows` of the
base class), alternating, best of 3 each. Prints ms per cycle and each against the one-row cycle.
"""
from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: the target's module imports torch
    from draftsmith.serve.core.target import Target


def make_drafter(method: str, target: Target, k: int, draft_vocab: int, packed: bool = True, sdpa: bool = False):
    """A freshly initialised drafter of a trained method (serve/methods/ registry) drafting k tokens a cycle over a
    draft vocabulary of `draft_vocab` tokens (0: the target's), its head packed as a loaded drafter's is (bf16 on a
    CPU: serve/core/packed.py `pack_head`) unless `packed` is False, and attending as a loaded drafter does
    (serve/drafters/attention.py) unless `sdpa`."""
    from draftsmith.serve.core.packed import pack_head
    from draftsmith.serve.drafters.attention import use_draft_attention
    from draftsmith.serve.methods import registry
    from draftsmith.train.config import ModelConfig

    kind = registry.method(method, trained=True)
    config = kind.config(ModelConfig(method=method, num_speculative_tokens=k, draft_vocab_size=draft_vocab), target)
    head = kind.head(config).to(target.model.dtype)
    if packed:
        pack_head(head, target.model)
    if not sdpa:
        use_draft_attention(head)
    return kind.drafter(head, target, check=False)


def features(drafter, target: Target, length: int, generator) -> dict:
    import torch

    h = target.model.config.hidden_size
    return {layer: torch.randn(length, h, generator=generator).to(target.model.dtype)
            for layer in drafter.target_layers}


def cycle_seconds(template, target: Target, rows: int, *, k: int, cycles: int, together: bool) -> float:
    """Seconds per drafting cycle of `rows` rows (the mean over `cycles`, after one warm-up cycle)."""
    import torch

    from draftsmith.serve.drafters.base import Drafter, prepare_batch, propose_batch

    generator = torch.Generator().manual_seed(0)
    drafters = [template.fork() for _ in range(rows)]
    for d in drafters:
        prompt = torch.randint(10, 1000, (96,), generator=generator)
        d.begin(prompt, torch.cat([prompt[1:], prompt[:1]]), features(d, target, 96, generator))
    calls = [dict(k=k, temperature=0.0, generator=None, tree=None) for _ in drafters]
    # the committed pairs' target states, drawn before the clock starts: a cycle times the drafting, not randn
    drawn = {n: [features(drafters[0], target, n, generator) for _ in range(4)] for n in range(1, k + 2)}

    def one_cycle() -> None:
        if together:  # as the batched decoder drafts
            prepare_batch(drafters)
            drafts = propose_batch(drafters, calls)
        else:
            drafts = Drafter.propose_rows(drafters, calls)
        for r, (d, draft) in enumerate(zip(drafters, drafts)):
            accepted = draft.tokens[:k].tolist() + [11]
            d.commit(torch.tensor(accepted), drawn[len(accepted)][r % 4])

    with torch.inference_mode():  # as the batched decoder's step runs
        one_cycle()
        start = time.perf_counter()
        for _ in range(cycles):
            one_cycle()
    return (time.perf_counter() - start) / cycles


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="demo")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--rows", default="1,4,16")
    parser.add_argument("--methods", default="eagle3,eagle1,medusa")
    parser.add_argument("--draft-vocab", type=int, default=4096, help="the demo's; 0 = the target's vocabulary")
    parser.add_argument("--plain-heads", action="store_true", help="heads on F.linear (before bf16 heads were packed)")
    parser.add_argument("--sdpa", action="store_true", help="heads on transformers' SDPA attention (as trained)")
    parser.add_argument("--cycles", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    import torch

    from draftsmith.serve.core.target import load_target

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    target = load_target(args.target, dtype=args.dtype)
    figures = {"target": target.name, "dtype": args.dtype, "k": args.k, "threads": args.threads,
               "draft_vocab": args.draft_vocab, "packed_heads": not args.plain_heads,
               "attention": "sdpa" if args.sdpa else "draft", "methods": {}}
    for method in args.methods.split(","):
        template = make_drafter(method, target, args.k, args.draft_vocab, not args.plain_heads, args.sdpa)
        per = {}
        for rows in [int(r) for r in args.rows.split(",")]:
            best = {"together": float("inf"), "row_by_row": float("inf")}
            for _ in range(3):
                for name in best:
                    seconds = cycle_seconds(template, target, rows, k=args.k, cycles=args.cycles,
                                            together=name == "together")
                    best[name] = min(best[name], seconds)
            per[rows] = {name: round(s * 1e3, 2) for name, s in best.items()}
        one = per[min(per)]["row_by_row"]
        for rows, ms in per.items():
            ms["together_against_one_row"] = round(ms["together"] / one, 2)
            ms["row_by_row_against_one_row"] = round(ms["row_by_row"] / one, 2)
            print(f"{method} {rows} rows: together {ms['together']} ms ({ms['together_against_one_row']}x one row), "
                  f"row by row {ms['row_by_row']} ms ({ms['row_by_row_against_one_row']}x)", file=sys.stderr,
                  flush=True)
        figures["methods"][method] = per
    if args.json:
        from draftsmith.eval.report import write_json

        write_json(figures, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
