"""The side-by-side run at batch size B > 1 (a `batch_size` sweep point): the prompts go through in batches of B,
every method decodes each batch back to back (our batched plain decoder, transformers' batched `generate`, every
drafter in serve/batch/decoder.py), so the noise of a shared machine hits them alike.

Each batch mixes domains (prompts taken round-robin over domains), as traffic does. A row's `seconds` is its share
of its batch's wall time (serve.decoding.SpecStats.share_seconds: each forward and cycle split among the rows in
it), so tokens/s over any set of rows, a domain's included, adds up to the batch's throughput. transformers'
`generate` runs a static left-padded batch until its longest row ends; its rows share the batch's time evenly.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import torch

from draftsmith.eval.drafters import BASELINE, DrafterEntry
from draftsmith.eval.prompts import EvalPrompt, group_by_domain
from draftsmith.eval.runner import WARMUP_TOKENS, Decoding, _from_result, _progress
from draftsmith.serve.batch.costs import warm_sizes
from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.core.target import Target

HF_BATCHED = "hf_plain"  # transformers' batched generate: the other plain baseline


def batch_groups(prompts: Sequence[EvalPrompt], batch_size: int) -> list[list[int]]:
    """Prompt indices in batches of `batch_size`, each drawn round-robin over the domains."""
    by_domain = [list(idx) for idx in group_by_domain(prompts).values()]
    order: list[int] = []
    while any(by_domain):
        for idx in by_domain:
            if idx:
                order.append(idx.pop(0))
    return [order[i: i + batch_size] for i in range(0, len(order), batch_size)]


def _record(result: Any) -> dict[str, Any]:
    """A batched row's record: the batch-1 record's fields, its seconds its share of the batch's wall time."""
    s = result.stats
    return {**_from_result(result), "seconds": float(s.share_seconds),
            "decode_seconds": float(s.share_seconds - s.share_prefill_seconds), "latency_seconds": float(s.seconds)}


def _decoder_run(decoder: Any, prompts: Sequence[EvalPrompt], group: Sequence[int], d: Decoding
                 ) -> list[dict[str, Any]]:
    from draftsmith.serve.batch.decoder import Job

    for i in group:
        decoder.add(Job(i, prompts[i].input_ids, max_new_tokens=d.max_new_tokens, temperature=d.temperature,
                        top_k=d.top_k, top_p=d.top_p, seed=d.seed + i))
    done = {f.job.key: f.result for f in decoder.run()}
    return [_record(done[i]) for i in group]


def left_pad(rows: Sequence[Sequence[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token rows -> input_ids (B, W) left-padded with `pad`, attention_mask (B, W): transformers' batched
    `generate` input."""
    width = max(map(len, rows))
    input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for b, row in enumerate(rows):
        input_ids[b, width - len(row):] = torch.tensor(list(row), dtype=torch.long)
        attention_mask[b, width - len(row):] = 1
    return input_ids, attention_mask


@torch.inference_mode()
def _hf_run(target: Target, prompts: Sequence[EvalPrompt], group: Sequence[int], d: Decoding) -> list[dict[str, Any]]:
    from draftsmith.eval.peers import generation_config

    model = target.model
    config = generation_config(target, max_new_tokens=d.max_new_tokens, temperature=d.temperature, top_k=d.top_k,
                               top_p=d.top_p)
    eos = set(target.eos_token_ids)
    pad = config.pad_token_id if config.pad_token_id is not None else target.eos_token_ids[0]
    config.pad_token_id = pad
    rows = [prompts[i].input_ids for i in group]
    input_ids, attention_mask = left_pad(rows, pad)
    width = input_ids.shape[1]
    device = next(model.parameters()).device
    torch.manual_seed(d.seed + group[0])
    start = time.perf_counter()
    out = model.generate(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device),
                         generation_config=config)
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    records = []
    for row in out[:, width:].tolist():
        cut = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
        records.append({"output_token_ids": row[:cut], "target_forwards": cut, "accepted_per_cycle": [0] * (cut - 1),
                        "drafted_per_cycle": [0] * (cut - 1), "cycles": cut - 1, "seconds": seconds / len(rows),
                        "decode_seconds": seconds / len(rows), "latency_seconds": seconds})
    return records


def run_batched(target: Target, entries: Sequence[DrafterEntry], prompts: Sequence[EvalPrompt], decoding: Decoding, *,
                batch_size: int, repeats: int = 1, warmup: bool = True, progress: bool = True,
                desc: str = "eval") -> dict[str, list[dict[str, Any]]]:
    """Plain (ours and transformers'), then every drafter, on every batch of `batch_size` prompts, interleaved
    batch by batch; with `repeats` > 1 each method's fastest run of a batch is kept. Returns method name ->
    records aligned with `prompts` (each also carries `batch_size`, `batch` and the batch's `batch_seconds`)."""
    from draftsmith.serve.batch.decoder import BatchDecoder

    decoding.check()
    if batch_size < 1:
        raise DraftsmithError(f"batch_size must be >= 1, got {batch_size}")
    for e in entries:  # the oracle's answers are computed before timing, as at batch 1
        if hasattr(e.drafter, "prepare"):
            for p in prompts:
                e.drafter.prepare(torch.tensor(p.input_ids, dtype=torch.long))
    decoders = {BASELINE: BatchDecoder(target, None, slots=batch_size)}
    for e in entries:
        decoders[e.name] = BatchDecoder(target, e.drafter, slots=batch_size, k=decoding.k, tree=e.tree)
        if decoders[e.name].costs is not None:
            # measured once, before any timing, at every size the batch passes through as its rows end (unwarmed,
            # a batch of 4 whose rows ended apart measured sizes 2 and 1 inside its timed run: 1-2 s of it)
            decoders[e.name].costs.warm(warm_sizes(batch_size))
    methods: dict[str, Callable[[Sequence[int], Decoding], list[dict[str, Any]]]] = {
        name: (lambda group, d, dec=dec: _decoder_run(dec, prompts, group, d)) for name, dec in decoders.items()}
    methods = {BASELINE: methods[BASELINE], HF_BATCHED: lambda group, d: _hf_run(target, prompts, group, d),
               **{e.name: methods[e.name] for e in entries}}
    groups = batch_groups(prompts, batch_size)
    if warmup and groups:
        short = Decoding(**{**decoding.__dict__, "max_new_tokens": min(WARMUP_TOKENS, decoding.max_new_tokens)})
        for fn in methods.values():
            fn(groups[0], short)
    records: dict[str, list[dict[str, Any] | None]] = {name: [None] * len(prompts) for name in methods}
    bar = _progress(total=len(groups) * len(methods) * repeats, desc=desc, enabled=progress)
    try:
        for g, group in enumerate(groups):
            runs: dict[str, list[tuple[float, list[dict[str, Any]]]]] = {name: [] for name in methods}
            for _ in range(repeats):
                for name, fn in methods.items():
                    start = time.perf_counter()
                    rows = fn(group, decoding)
                    runs[name].append((time.perf_counter() - start, rows))
                    bar.update(1)
            for name, tries in runs.items():
                seconds, rows = min(tries, key=lambda t: t[0])
                outputs = [r["output_token_ids"] for r in rows]
                differ = any([r["output_token_ids"] for r in other] != outputs for _, other in tries)
                for i, row in zip(group, rows):
                    p = prompts[i]
                    records[name][i] = {"id": p.id, "domain": p.domain, "drafter": name,
                                        "prompt_token_ids": list(p.input_ids), "seed": decoding.seed + i, **row,
                                        "batch_size": batch_size,
                                        "batch": g, "batch_seconds": seconds,
                                        "repeat_seconds": [t for t, _ in tries], "repeats_differ": differ}
    finally:
        bar.close()
    return {name: [r for r in recs if r is not None] for name, recs in records.items()}
