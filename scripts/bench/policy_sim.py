"""Draft-length and hybrid policies compared on a modelled clock: the same decisions every run, whatever the machine.

A policy decides from wall time (serve/drafters/length.py), so on a noisy machine two runs of one policy already
differ, and a paused head that retries a cycle later can sit out a whole prompt: wall-clock A/Bs of a policy
change need more prompts and repeats than a CPU-hour holds. Here the decoder's clock advances only by modelled
costs, measured once at the start and shared by every arm: a target forward over n new tokens costs V(n-1) steps
(serve/core/costs.py), an EAGLE head's catch-up over L committed pairs and its draft step what they took when timed
here. Arms then differ only by their policy; each keeps its drafter (and its learned state) across prompts, as
eval does. Prefill is left out (the same for every arm): the speedups are the decode phase's.

    python scripts/bench/policy_sim.py --head runs/demo/eagle3/drafter --prompts held.jsonl --limit 3 \
        --arm e3-old=HEAD@trial=1 --arm e3=HEAD --arm hybrid-trees=hybrid:HEAD --arm hybrid-chains=hybrid:HEAD@trees=0

HEAD in an arm's spec stands for --head, with the spec's options (`--arm chains=HEAD:leaves=0`: chains without
runner-up leaves). `@trial=N` sets the head's trial length (1: one-cycle retries, the previous behaviour), `@wait=N`
and `@max_wait=N` the paused cycles before its first retry and the most it waits between retries, `@max_k=N` caps the n-gram side's drafts at max(K, N)
(0: K), `@reach=always` lets them run past K in any cycle, not only while the text copies, `@local=W` weighs the
n-gram side's acceptance estimate pooled over every prompt as W of the current prompt's drafts (0: the pooled
estimate alone), `@gen=W` scales the n-gram side's pooled estimates by how the current prompt's drafts of every key
fared against them, with W pseudo-drafts (0: not scaled; the n-gram drafter alone defaults to 2, a hybrid's side to
0), `@trees=0` keeps the hybrid's greedy cycles to one drafter's chain (no tree joining the n-gram's chain to the
head's). The arm `prompt_lookup` is transformers' prompt lookup, redone as a drafter (`--arm pl=prompt_lookup`): the
peer eval times, here on the same clock. `--costs V1,V2,...` fixes the verify costs instead of measuring them:
the arms of one run always share them, and with them fixed two runs on a busy machine compare too.
"""
from __future__ import annotations

import argparse
import statistics
import time
import types
from contextlib import ExitStack
from unittest import mock
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: the target's module imports torch
    from draftsmith.serve.core.target import Target


class ModelledClock:
    """Stands in for `time` in the decoder and the length policy: `perf_counter` reads the modelled seconds."""

    def __init__(self) -> None:
        self.t = 0.0

    def perf_counter(self) -> float:
        return self.t


def _median_seconds(fn, repeats: int = 15) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def head_costs(drafter, step_seconds: float) -> tuple[dict[int, float], float, float]:
    """An EAGLE drafter's costs in target steps: catch-up over L pairs {L: steps}, a draft step's head forward, and
    its logits over one row. Timed on a fresh cache (the head is one layer: its context length matters little)."""
    import torch
    from transformers import DynamicCache

    from draftsmith.serve.drafters.masks import causal_allowed
    from draftsmith.serve.core.kv import rollback

    width, vocab = drafter.config.hidden_size, drafter.embed.num_embeddings
    catch_up = {}
    with torch.no_grad():
        for n in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512):
            hidden = {layer: torch.randn(n, width) for layer in drafter.target_layers}

            def consume(n=n, hidden=hidden):
                drafter._cache, drafter.n = DynamicCache(), 0
                drafter._consume(torch.arange(n) % vocab, hidden)
            catch_up[n] = _median_seconds(consume) / step_seconds
        last = drafter._last_out

        def step():
            drafter._run(last[None], torch.tensor([1]), torch.tensor([drafter.n]),
                         causal_allowed(1, drafter._cache.get_seq_length()))
            rollback(drafter._cache, drafter.n)
        step_cost = _median_seconds(step) / step_seconds
        logits_cost = _median_seconds(lambda: drafter._logits_of(last[None])) / step_seconds
    return catch_up, step_cost, logits_cost


def interpolate(table: dict[int, float], n: int) -> float:
    """Piecewise linear in n through the measured points; linear from the origin past the last."""
    points = sorted(table.items())
    if n <= points[0][0]:
        return points[0][1]
    for (n0, c0), (n1, c1) in zip(points, points[1:]):
        if n <= n1:
            return c0 + (c1 - c0) * (n - n0) / (n1 - n0)
    return points[-1][1] * n / points[-1][0]


def modelled(stack: ExitStack, clock: ModelledClock, target: Target, costs, head) -> None:
    """Patch the decoder so that `clock` advances by the modelled cost of every target forward and head forward."""
    import draftsmith.serve.decoding
    import draftsmith.serve.drafters.length
    import draftsmith.serve.methods.hybrid.drafter
    from draftsmith.serve.drafters.eagle_drafter import EagleDrafter

    seconds = costs.step_seconds
    catch_up, step_cost, logits_cost = head_costs(head, seconds)
    print("modelled costs in target steps: verify V(n) " +
          ", ".join(f"{n}:{costs.ratio(n):.2f}" for n in range(9)) +
          f"; head catch-up over 1/64/512 pairs {interpolate(catch_up, 1):.3f}/{interpolate(catch_up, 64):.3f}/"
          f"{interpolate(catch_up, 512):.3f}, draft step {step_cost + logits_cost:.3f}", flush=True)
    fake = types.SimpleNamespace(perf_counter=clock.perf_counter)
    stack.enter_context(mock.patch.object(draftsmith.serve.drafters.length, "time", fake))
    stack.enter_context(mock.patch.object(draftsmith.serve.decoding, "time", fake))
    # it times the head's work
    stack.enter_context(mock.patch.object(draftsmith.serve.methods.hybrid.drafter, "time", fake))
    inside = {"catch_up": False}
    run, logits, consume = EagleDrafter._run, EagleDrafter._logits_of, EagleDrafter._consume

    def timed_run(self, hidden_in, token_ids, positions, allowed):
        if not inside["catch_up"]:
            clock.t += step_cost * seconds * int(token_ids.numel())
        return run(self, hidden_in, token_ids, positions, allowed)

    def timed_logits(self, out):
        if not inside["catch_up"]:
            clock.t += logits_cost * seconds * out.shape[0]
        return logits(self, out)

    def timed_consume(self, next_tokens, hidden_states):
        clock.t += interpolate(catch_up, int(next_tokens.numel())) * seconds
        inside["catch_up"] = True
        try:
            return consume(self, next_tokens, hidden_states)
        finally:
            inside["catch_up"] = False

    stack.enter_context(mock.patch.object(EagleDrafter, "_run", timed_run))
    stack.enter_context(mock.patch.object(EagleDrafter, "_logits_of", timed_logits))
    stack.enter_context(mock.patch.object(EagleDrafter, "_consume", timed_consume))

    def forward_cost(module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        if ids is not None and cache is not None and cache.get_seq_length() > 0:  # a verify; the prefill is left out
            clock.t += costs.ratio(int(ids.shape[1]) - 1) * seconds
    stack.callback(target.model.register_forward_pre_hook(forward_cost, with_kwargs=True).remove)


class PromptLookup:
    """transformers' prompt lookup (`PromptLookupCandidateGenerator`, max_matching_ngram_size=2) as a drafter: the
    first occurrence, left to right, of the last 2 (else 1) tokens with a continuation, which drafts all k."""

    kind, target_layers, default_k, default_tree = "prompt_lookup", (), None, None

    def begin(self, prompt_ids, next_tokens, hidden_states) -> None:
        import torch
        self.tokens = torch.cat([prompt_ids[:1], next_tokens]).long()

    def commit(self, next_tokens, hidden_states) -> None:
        import torch
        self.tokens = torch.cat([self.tokens, next_tokens.long()])

    def draft_cap(self, k: int) -> int:
        return k  # transformers drafts prompt_lookup_num_tokens every cycle

    def propose(self, k, *, temperature=0.0, generator=None, tree=None):
        from draftsmith.serve.drafters.base import Draft
        tokens, length = self.tokens, self.tokens.numel()
        for n in range(min(2, length - 1), 0, -1):
            hits = (tokens.unfold(0, n, 1) == tokens[-n:]).all(dim=1).nonzero().flatten()  # (H,) window starts
            for start in (hits + n).tolist():
                if start < length:
                    return Draft(tokens[start: start + k].clone())
        return Draft.empty()


def build_arm(spec: str, head: str, target: Target):
    """`SPEC[@trial=N,wait=N,max_wait=N,max_k=N,reach=R,local=W,gen=W,trees=B]` -> the drafter,
    with its policy settings applied; `prompt_lookup` is transformers' prompt lookup."""
    from draftsmith.serve.drafters import build_drafter
    from draftsmith.serve.methods.hybrid.drafter import HybridDrafter
    from draftsmith.serve.methods.ngram.drafter import NgramDrafter
    from draftsmith.serve.core.errors import DraftsmithError

    spec, _, options = spec.partition("@")
    if spec == "prompt_lookup":
        return PromptLookup()
    drafter = build_drafter(spec.replace("HEAD", head), target)
    for option in filter(None, options.split(",")):
        key, _, value = option.partition("=")
        policy = (drafter.head if isinstance(drafter, HybridDrafter) else drafter).policy
        ngram = drafter.ngram if isinstance(drafter, HybridDrafter) else drafter
        if key == "trial" and hasattr(policy, "trial"):
            policy.trial = int(value)
        elif key in ("wait", "max_wait") and hasattr(policy, "max_explore"):
            setattr(policy, "explore" if key == "wait" else "max_explore", int(value))
            policy._wait = policy.explore
        elif key == "max_k" and isinstance(ngram, NgramDrafter):
            ngram.max_k = int(value)
        elif key == "reach" and isinstance(ngram, NgramDrafter) and value in ("copying", "always"):
            ngram.reach = value
        elif key == "trees" and isinstance(drafter, HybridDrafter):
            drafter.trees = bool(int(value))
        elif key == "local" and isinstance(ngram, NgramDrafter) and hasattr(ngram.policy, "local_weight"):
            ngram.policy.local_weight = float(value)
        elif key == "gen" and isinstance(ngram, NgramDrafter) and hasattr(ngram.policy, "generation_weight"):
            ngram.policy.generation_weight = float(value)
        else:
            raise DraftsmithError(f"arm option {option!r}: takes trial=N, wait=N or max_wait=N (auto length), "
                                  "max_k=N, reach=copying|always, local=W or gen=W (n-gram, hybrid), "
                                  "trees=0|1 (hybrid)")
    return drafter


def fixed_costs(model, text: str):
    """`--costs 1.09,1.30,...` -> those verify costs, installed as the ones measured for `model` (every drafter's
    policy reads them); the 1-token step's seconds are still timed (a head's costs are relative to it)."""
    import draftsmith.serve.core.costs
    from draftsmith.serve.core.errors import DraftsmithError

    try:
        ratios = [float(v) for v in text.split(",")]
    except ValueError:
        raise DraftsmithError(f"--costs takes numbers V(1),V(2),... separated by commas, got {text!r}") from None
    if any(r < 1.0 for r in ratios):  # (an empty --costs fails float() above)
        raise DraftsmithError(f"--costs: every V(n) is a verify forward over a 1-token step, so >= 1; got {text!r}")
    measured = draftsmith.serve.core.costs.verify_costs_for(model)
    costs = draftsmith.serve.core.costs.VerifyCosts(ratios={0: 1.0, **{n: r for n, r in enumerate(ratios, 1)}},
                                    step_seconds=measured.step_seconds)
    draftsmith.serve.core.costs.use_verify_costs(model, costs)
    return costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--head", required=True, help="a trained EAGLE drafter folder (HEAD in the arms' specs)")
    parser.add_argument("--arm", action="append", required=True,
                        metavar="NAME=SPEC[@trial=N,wait=N,max_wait=N,max_k=N,reach=R,local=W,gen=W,trees=B]")
    parser.add_argument("--prompts", action="append", default=[], help="prompt sources (default: builtin)")
    parser.add_argument("--target", default="demo")
    parser.add_argument("--limit", type=int, default=None, help="prompts per domain")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--costs", default=None, metavar="V1,V2,...",
                        help="verify costs V(1), V(2), ... in target steps instead of measuring them (runs on a busy "
                             "machine then decide alike, and two runs' tables compare)")
    args = parser.parse_args()

    import torch

    from draftsmith.eval.config import EvalConfig
    from draftsmith.eval.prompts import prepare_prompts
    from draftsmith.eval.evaluate import _as_rows
    from draftsmith.serve.core.costs import verify_costs_for
    from draftsmith.serve.decoding import speculative_generate
    from draftsmith.serve.drafters import build_drafter
    from draftsmith.serve.drafters.eagle_drafter import EagleDrafter
    from draftsmith.serve.core.errors import DraftsmithError
    from draftsmith.serve.core.target import load_target

    torch.set_num_threads(1)
    target = load_target(args.target)
    rows, _ = _as_rows(args.prompts or ["builtin"], EvalConfig(per_domain_limit=args.limit))
    prompts = prepare_prompts(target.tokenizer, rows)  # in eval's order
    head = build_drafter(args.head, target)
    if not isinstance(head, EagleDrafter):
        raise DraftsmithError(f"--head {args.head} is a {head.kind} drafter: the modelled clock times EAGLE heads only "
                              "(their catch-up and draft step); give an EAGLE-1 or EAGLE-3 drafter folder")
    costs = verify_costs_for(target.model) if args.costs is None else fixed_costs(target.model, args.costs)
    with ExitStack() as stack:
        clock = ModelledClock()
        modelled(stack, clock, target, costs, head)
        arms = {name: build_arm(spec, args.head, target) for name, spec in (a.split("=", 1) for a in args.arm)}
        plain, spent = {}, {name: {} for name in arms}  # domain -> steps
        for p in prompts:
            reference, cells = None, []
            for name, drafter in arms.items():
                clock.t = 0.0
                result = speculative_generate(target, drafter, torch.tensor([p.input_ids]),
                                              max_new_tokens=args.max_new_tokens)
                reference = reference or result.output_ids
                if result.output_ids != reference:
                    raise SystemExit(f"{name} left the other arms' greedy output on {p.id}")
                steps = result.stats.seconds / costs.step_seconds
                spent[name][p.domain] = spent[name].get(p.domain, 0.0) + steps
                cells.append(f"{name} {(len(reference) - 1) / steps:.3f}x μ{result.stats.mu:.2f}")
            plain[p.domain] = plain.get(p.domain, 0) + len(reference) - 1  # a plain step per token after the first
            print(f"{p.domain:<14} {p.id[:16]:<16} " + "  ".join(cells), flush=True)
    width = max(12, *(len(n) + 2 for n in arms))
    print("\nmodelled decode-phase speedup over plain decoding")
    print(f"{'domain':<14}" + "".join(f"{n:>{width}}" for n in arms))
    for domain in list(plain) + ["overall"]:
        total = sum(plain.values()) if domain == "overall" else plain[domain]
        cells = [total / (sum(spent[n].values()) if domain == "overall" else spent[n][domain]) for n in arms]
        print(f"{domain:<14}" + "".join(f"{c:>{width}.3f}" for c in cells))


if __name__ == "__main__":
    from draftsmith.serve.core.errors import DraftsmithError

    try:
        main()
    except DraftsmithError as err:
        raise SystemExit(f"error: {err}") from None
