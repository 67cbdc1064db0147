"""Sampling exactness: the joint distribution of the first tokens under speculative sampling equals the target's.

The target's exact distribution over the first three tokens is enumerated (vocab 8: 512 outcomes), then
thousands of speculative samples are compared with it by a chi-square test, for drafters whose q
differs clearly from p: a stochastic draft model (chain with q), and deterministic trees and chains. These run
unseeded requests (the rejection sampler, serve/verify.py; torch's global seed set per sample, so the test
repeats); seeded requests draw per-position noise (serve/core/noise.py): plain seeded decoding is tested here,
and speculation reproducing it token for token in tests/test_seeded_sampling.py.
"""
from __future__ import annotations

import pytest
import torch

from draftsmith.serve.core.costs import VerifyCosts
from draftsmith.serve.decoding import plain_generate, speculative_generate
from draftsmith.serve.drafters.length import ExpectedGain
from draftsmith.serve.methods.model.drafter import ModelDrafter
from tests.decoder_fixtures import (PROMPT, SAMPLES, SETTINGS, STEPS, VOCAB, GreedyTreeDrafter, chi_square_p,
                                    exact_joint, sampling_target)
from tests.tiny_models import tiny_model


@pytest.fixture(scope="module")
def target():
    return sampling_target()


def speculative_samples(target, drafter, settings, n: int = SAMPLES) -> tuple[dict[tuple, int], int]:
    """Counts of the first STEPS tokens over n unseeded speculative generations, and the drafts accepted."""
    counts: dict[tuple, int] = {}
    accepted = 0
    for seed in range(n):
        torch.manual_seed(seed)
        res = speculative_generate(target, drafter, PROMPT, max_new_tokens=STEPS, k=2, eos_token_ids=(), **settings)
        counts[tuple(res.output_ids)] = counts.get(tuple(res.output_ids), 0) + 1
        accepted += sum(res.stats.accepted_per_cycle)
    return counts, accepted




@pytest.mark.parametrize("settings", SETTINGS, ids=["t0.7-top_p0.9", "t1.0-top_k6"])
@pytest.mark.parametrize("drafter_kind", ["model-sampled", "tree", "greedy-chain", "eagle3-min-confidence"])
def test_speculative_sampling_matches_target_distribution(target, settings, drafter_kind):
    other = tiny_model("llama", vocab_size=VOCAB, seed=11, eos_token_id=None, pad_token_id=None)
    if drafter_kind == "model-sampled":
        drafter = ModelDrafter(other, target.tokenizer, target_vocab_size=VOCAB)
    elif drafter_kind == "eagle3-min-confidence":  # a sampled EAGLE-3 chain whose length varies with confidence
        from draftsmith.serve.methods.eagle3.head import eagle3_config
        from draftsmith.serve.drafters.folder import build_head, make_drafter

        torch.manual_seed(5)
        head = build_head(eagle3_config(target, aux_layer_ids=[0, 1, 1]))
        drafter = make_drafter(head, target, check=False, min_confidence=0.2)
    else:
        drafter = GreedyTreeDrafter(other, tree=drafter_kind == "tree")
    counts, accepted = speculative_samples(target, drafter, settings)
    assert accepted > SAMPLES * 0.1, "the drafter should get some drafts accepted, or the test proves little"
    assert chi_square_p(counts, exact_joint(target, settings), SAMPLES) > 1e-3


@pytest.mark.parametrize("seeded", [True, False], ids=["seeded-position-noise", "unseeded-stream"])
@pytest.mark.parametrize("settings", SETTINGS, ids=["t0.7-top_p0.9", "t1.0-top_k6"])
def test_plain_sampling_matches_target_distribution(target, settings, seeded):
    exact = exact_joint(target, settings)
    counts: dict[tuple, int] = {}
    for seed in range(SAMPLES):
        torch.manual_seed(seed)
        res = plain_generate(target, PROMPT, max_new_tokens=STEPS, seed=seed if seeded else None, eos_token_ids=(),
                             **settings)
        counts[tuple(res.output_ids)] = counts.get(tuple(res.output_ids), 0) + 1
    assert chi_square_p(counts, exact, SAMPLES) > 1e-3


def test_a_biased_verifier_is_detected(target, monkeypatch):
    """The test has power: always accepting the draft (no rejection sampling) is caught."""
    import draftsmith.serve.decoding as decoding
    from draftsmith.serve.verify import Verdict

    def accept_all(tokens, p, q, generator):
        return Verdict(list(range(tokens.numel())), int(torch.multinomial(p[-1], 1, generator=generator)))

    monkeypatch.setattr(decoding, "verify_chain", accept_all)
    other = tiny_model("llama", vocab_size=VOCAB, seed=11, eos_token_id=None, pad_token_id=None)
    drafter = ModelDrafter(other, target.tokenizer, target_vocab_size=VOCAB)
    settings = SETTINGS[1]
    exact = exact_joint(target, settings)
    counts, _ = speculative_samples(target, drafter, settings, SAMPLES // 2)
    with pytest.raises(AssertionError):
        assert chi_square_p(counts, exact, SAMPLES // 2) > 1e-3


FLAT = VerifyCosts(ratios={0: 1.0, 8: 1.2})  # no step time: c stays 0, the test does not depend on timing


def _auto_drafter(target, kind: str):
    """A drafter whose length is chosen per step (calibration learning across the samples, as in serving)."""
    from draftsmith.serve.methods.eagle3.head import eagle3_config
    from draftsmith.serve.drafters.folder import build_head, make_drafter
    from draftsmith.serve.methods.hybrid.drafter import HybridDrafter
    from draftsmith.serve.methods.medusa.head import medusa_config
    from draftsmith.serve.methods.ngram.drafter import NgramDrafter

    torch.manual_seed(5)
    if kind == "model-auto":
        other = tiny_model("llama", vocab_size=VOCAB, seed=11, eos_token_id=None, pad_token_id=None)
        return ModelDrafter(other, target.tokenizer, target_vocab_size=VOCAB, policy=ExpectedGain(FLAT))
    if kind == "dflash-auto":
        from draftsmith.serve.methods.dflash.head import dflash_config

        drafter = make_drafter(build_head(dflash_config(target, aux_layer_ids=[0, 1], block_size=3, mask_token_id=0)),
                               target, check=False)
    elif kind == "peagle-auto":
        from draftsmith.serve.methods.peagle.head import peagle_config

        drafter = make_drafter(build_head(peagle_config(target, depths=3, aux_layer_ids=[0, 1, 1], mask_token_id=0)),
                               target, check=False)
    elif kind == "medusa-auto":
        heads = build_head(medusa_config(target, num_heads=2))
        heads.init_from_target(target.model.get_output_embeddings().weight)  # head 0 agrees with the target often
        drafter = make_drafter(heads, target, check=False)
    else:
        drafter = make_drafter(build_head(eagle3_config(target, aux_layer_ids=[0, 1, 1])), target, check=False)
    drafter.policy = ExpectedGain(FLAT)
    if kind == "hybrid":  # single-token matches, so the n-gram side drafts in a 5-token prompt too
        return HybridDrafter(drafter, NgramDrafter(min_n=1, policy=ExpectedGain(FLAT)))
    return drafter


@pytest.mark.parametrize("drafter_kind", ["eagle3-auto", "medusa-auto", "dflash-auto", "peagle-auto", "model-auto",
                                          "hybrid"])
def test_per_step_length_sampling_matches_target_distribution(target, drafter_kind):
    """Lengths chosen per step from the draft's own distribution (never from the sampled token) and a hybrid that
    picks its side per cycle keep speculative sampling exact."""
    settings = SETTINGS[0]
    drafter = _auto_drafter(target, drafter_kind)
    counts, accepted = speculative_samples(target, drafter, settings)
    assert accepted > SAMPLES * 0.1, "the drafter should get some drafts accepted, or the test proves little"
    assert chi_square_p(counts, exact_joint(target, settings), SAMPLES) > 1e-3
