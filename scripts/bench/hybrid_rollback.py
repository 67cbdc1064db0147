"""What rolling a hybrid target's recurrent state back costs: a verify forward over K+1 tokens on a cached context
with state recording (the state after each token kept, so that a rejected draft can be undone: serve/core/kv.py)
over the same forward without it, per K, interleaved in one process; and the decode speed of plain decoding, our
speculative decoder with n-gram drafts, transformers' prompt lookup (`prompt_lookup_num_tokens`) on the same
prompts, with their outputs compared.

    python -m draftsmith.bench.hybrid_rollback --target FOLDER [--context 256] [--repeats 7] [--threads 1]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from draftsmith.serve.core.kv import cache_kwargs, new_cache, record_states, recurrent_layer_kinds, rollback
from draftsmith.serve.core.target import Target, load_target


@torch.inference_mode()
def recording_ratios(model, *, context: int, ks: list[int], repeats: int) -> dict[int, tuple[float, float]]:
    """K -> (median, spread) of (verify forward with recording) / (without), over `repeats` interleaved rounds."""
    vocab = int(model.config.get_text_config().vocab_size)
    ids = torch.randint(0, vocab, (1, context + max(ks) + 1), generator=torch.Generator().manual_seed(0))
    caches = {}
    for recording in (True, False):
        caches[recording] = new_cache(model, rolls_back=recording)
        model(ids[:, :context], logits_to_keep=1, **cache_kwargs(model, caches[recording]))
    seconds: dict[tuple[int, bool], list[float]] = {(k, r): [] for k in ks for r in (True, False)}
    for round_ in range(repeats + 1):  # round 0 warms every shape up
        for k in ks:
            for recording in (True, False):
                cache = caches[recording]
                if recording:
                    record_states(cache, k + 1)
                else:
                    snapshot = [_state_copy(layer) for layer in cache.layers]
                began = time.perf_counter()
                model(ids[:, context: context + k + 1], **cache_kwargs(model, cache))
                elapsed = time.perf_counter() - began
                if recording:
                    rollback(cache, context)
                else:
                    _restore(cache, snapshot, context)
                if round_:
                    seconds[k, recording].append(elapsed)
    out = {}
    for k in ks:
        ratios = [a / b for a, b in zip(seconds[k, True], seconds[k, False])]
        out[k] = (statistics.median(ratios), max(ratios) - min(ratios))
    return out


def _state_copy(layer):
    """A recurrent layer's states before a forward that is not recorded (the baseline restores them by copy)."""
    if not hasattr(layer, "conv_states"):
        return None
    return ({i: None if t is None else t.clone() for i, t in layer.conv_states.items()},
            {i: None if t is None else t.clone() for i, t in layer.recurrent_states.items()},
            layer.cumulative_length_linear.clone())


def _restore(cache, snapshot, keep: int) -> None:
    for layer, saved in zip(cache.layers, snapshot):
        if saved is None:
            if getattr(layer, "is_initialized", False) and getattr(layer, "keys", None) is not None:
                layer.crop(-(int(layer.get_seq_length()) - keep))
            continue
        conv, recurrent, length = saved
        for i in conv:
            if conv[i] is not None:
                layer.conv_states[i].copy_(conv[i])
            if recurrent[i] is not None:
                layer.recurrent_states[i].copy_(recurrent[i])
        layer.cumulative_length_linear.copy_(length)
        if getattr(layer, "keys", None) is not None:  # a layer holding both (Falcon-H1)
            layer.keys, layer.values = layer.keys[:, :, :keep], layer.values[:, :, :keep]


def decode_side_by_side(target: Target, prompts: list[torch.Tensor], *, max_new_tokens: int, rounds: int) -> None:
    """Our plain and n-gram decoding, transformers' greedy `generate` and its prompt lookup, interleaved per
    prompt; speed over our plain decoding's, and each output against the plain one of its own stack (and
    transformers' plain against ours)."""
    from draftsmith.serve.decoding import plain_generate, speculative_generate
    from draftsmith.serve.drafters import build_drafter

    model = target.model

    def hf(prompt: torch.Tensor, **extra) -> list[int]:
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                             max_new_tokens=max_new_tokens, pad_token_id=target.tokenizer.pad_token_id, **extra)
        return out[0, prompt.shape[1]:].tolist()

    runs = {"plain": lambda p: plain_generate(target, p, max_new_tokens=max_new_tokens).output_ids,
            "ngram": lambda p: speculative_generate(target, build_drafter("ngram", target), p,
                                                    max_new_tokens=max_new_tokens, k=5).output_ids,
            "hf plain": hf,
            "hf prompt lookup": lambda p: hf(p, prompt_lookup_num_tokens=5)}
    reference = {"ngram": "plain", "hf plain": "plain", "hf prompt lookup": "hf plain"}
    times = {name: 0.0 for name in runs}
    outputs: dict[str, list[list[int]]] = {name: [] for name in runs}
    for round_ in range(rounds):
        for prompt in prompts:
            for name, run in runs.items():
                began = time.perf_counter()
                tokens = run(prompt)
                times[name] += time.perf_counter() - began
                if round_ == 0:
                    outputs[name].append(tokens)
    for name in runs:
        same = ""
        if name in reference:
            ref = reference[name]
            equal = sum(a == b for a, b in zip(outputs[name], outputs[ref]))
            same = f", identical to {ref} {equal}/{len(prompts)}"
        print(f"  {name:18s} {times['plain'] / times[name]:.2f}x our plain decoding's speed{same}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--ks", default="1,3,5,8")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    target = load_target(args.target)
    kinds = recurrent_layer_kinds(target.model)
    print(f"target {args.target} ({target.config.model_type}; recurrent layers: {', '.join(kinds) or 'none'}), "
          f"context {args.context}, {args.threads} thread(s), {args.repeats} interleaved rounds")
    print("verify forward with state recording / without (median, spread over rounds):")
    for k, (ratio, spread) in recording_ratios(target.model, context=args.context,
                                              ks=[int(k) for k in args.ks.split(",")],
                                              repeats=args.repeats).items():
        print(f"  K={k}: {ratio:.3f} (spread {spread:.3f})")
    gen = torch.Generator().manual_seed(1)
    vocab = min(256, int(target.config.get_text_config().vocab_size))
    prompts = [torch.randint(0, vocab, (1, 16), generator=gen).repeat(1, 3) for _ in range(4)]
    print(f"decoding {len(prompts)} repeating prompts, {args.max_new_tokens} tokens, greedy, 2 rounds:")
    decode_side_by_side(target, prompts, max_new_tokens=args.max_new_tokens, rounds=2)


if __name__ == "__main__":
    main()
