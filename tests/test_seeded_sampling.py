"""Seeded sampling is reproducible under speculation: the same seed gives plain seeded decoding's tokens alone, in a
batch beside other requests, with every drafter, chain or tree, fixed or per-step draft length (serve/core/noise.py).
That the seeded tokens follow the target's distribution is tested by a chi-square test on plain seeded decoding
(tests/test_decoder_sampling.py); here, that speculation reproduces them token for token."""
from __future__ import annotations

import pytest
import torch

from draftsmith.serve.batch.decoder import BatchDecoder, Job
from draftsmith.serve.core.noise import PositionNoise, gumbel, position_key
from draftsmith.serve.core.target import load_target
from draftsmith.serve.decoding import plain_generate, speculative_generate
from draftsmith.serve.drafters import build_drafter
from draftsmith.serve.tree import TreeSpec
from tests.decoder_fixtures import GreedyTreeDrafter
from tests.tiny_models import tiny_model

SEEDS = (0, 1, 2, 1003, -7, 2**64 - 1)
SAMPLED = dict(temperature=0.7, top_p=0.95)
NEW = 20


@pytest.fixture(scope="module")
def target(tiny_target_dir):
    return load_target(tiny_target_dir)


def prompts(n: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(9)
    return [torch.randint(0, 256, (int(length),), generator=g).tolist() * 2  # repeats: the n-gram drafter drafts
            for length in torch.randint(3, 15, (n,), generator=g)]


def plain_seeded(target, prompt, seed, **probs) -> list[int]:
    return plain_generate(target, torch.tensor([prompt]), max_new_tokens=NEW, seed=seed, eos_token_ids=(),
                          **probs).output_ids


def make_drafter(spec: str, target, tiny_target_dir):
    from draftsmith.serve.methods.eagle3.head import eagle3_config
    from draftsmith.serve.drafters.folder import build_head, make_drafter as head_drafter
    from draftsmith.serve.methods.hybrid.drafter import HybridDrafter
    from draftsmith.serve.drafters.length import ExpectedGain, FixedLength
    from draftsmith.serve.methods.medusa.head import medusa_config
    from draftsmith.serve.methods.ngram.drafter import NgramDrafter
    from draftsmith.serve.core.costs import VerifyCosts

    flat = VerifyCosts(ratios={0: 1.0, 8: 1.2})
    torch.manual_seed(5)
    if spec == "self":  # the target as its own draft model: a sampled chain that shares the target's noise
        drafter = build_drafter(f"model:{tiny_target_dir}", target)
        drafter.policy = FixedLength()  # the random target is too flat for the expected-gain policy to draft
        return drafter
    if spec == "tree":
        return GreedyTreeDrafter(tiny_model("llama", seed=11), tree=True)
    if spec in ("eagle3", "eagle3-auto", "hybrid"):
        drafter = head_drafter(build_head(eagle3_config(target, aux_layer_ids=[0, 1, 1])), target, check=False)
        if spec != "eagle3":
            drafter.policy = ExpectedGain(flat)
        if spec == "hybrid":
            return HybridDrafter(drafter, NgramDrafter(min_n=1, policy=ExpectedGain(flat)))
        return drafter
    if spec == "medusa":
        heads = build_head(medusa_config(target, num_heads=3))
        heads.init_from_target(target.model.get_output_embeddings().weight)
        return head_drafter(heads, target, check=False)
    return build_drafter(spec, target)


def test_position_noise_depends_on_seed_and_position_only():
    assert position_key(1003, 5) == position_key(1003, 5)
    assert len({position_key(s, p) for s in (0, 1, -1, 12345) for p in range(50)}) == 200
    assert torch.equal(gumbel(3, 7, 100), gumbel(3, 7, 100))
    assert not torch.equal(gumbel(3, 7, 100), gumbel(3, 8, 100))
    noise = PositionNoise(3)
    assert torch.equal(noise.at(7, 100), gumbel(3, 7, 100))


@pytest.mark.parametrize("spec,k", [("ngram", 4), ("self", 3), ("tree", 3), ("eagle3", 4), ("eagle3-auto", 4),
                                    ("medusa", 3), ("hybrid", 4)])
def test_seeded_speculation_gives_plain_seeded_tokens(target, tiny_target_dir, spec, k):
    drafter = make_drafter(spec, target, tiny_target_dir)
    tree = TreeSpec() if spec == "medusa" else None
    accepted = 0
    for i, prompt in enumerate(prompts(3)):
        for seed in SEEDS[i::3]:
            expected = plain_seeded(target, prompt, seed, **SAMPLED)
            res = speculative_generate(target, drafter, torch.tensor([prompt]), max_new_tokens=NEW, k=k, seed=seed,
                                       eos_token_ids=(), tree=tree, **SAMPLED)
            assert res.output_ids == expected, (spec, seed)
            accepted += sum(res.stats.accepted_per_cycle)
    if spec == "self":
        assert accepted > 0, "no draft was ever accepted: the test would prove little"


def test_a_drafter_that_shares_the_noise_drafts_the_target_tokens(target, tiny_target_dir):
    """The target drafting for itself with the same noise proposes the very tokens it then samples: nearly every
    draft is accepted (a drafter sampling with its own stream would be accepted at sum p^2, far less)."""
    drafter = make_drafter("self", target, tiny_target_dir)
    res = speculative_generate(target, drafter, torch.tensor([prompts(1)[0]]), max_new_tokens=40, k=4, seed=5,
                               eos_token_ids=(), temperature=1.0)
    drafted, accepted = sum(res.stats.drafted_per_cycle), sum(res.stats.accepted_per_cycle)
    assert accepted >= 0.9 * drafted > 0


@pytest.mark.parametrize("spec", ["plain", "ngram", "self", "eagle3-auto"])
def test_seeded_rows_give_the_same_tokens_alone_and_in_a_mixed_batch(target, tiny_target_dir, spec):
    """Eight seeded requests among others (greedy, other temperatures, unseeded) at batch 4: each one's tokens are
    plain seeded decoding's."""
    drafter = None if spec == "plain" else make_drafter(spec, target, tiny_target_dir)
    texts = prompts(12)
    decoder = BatchDecoder(target, drafter, slots=4, k=3, costs=False)
    seeded = {}
    for i, prompt in enumerate(texts):
        if i % 3 == 2:  # neighbours: greedy, unseeded sampling at another temperature
            decoder.add(Job(f"other{i}", prompt, max_new_tokens=NEW + i, eos_token_ids=(),
                            temperature=0.0 if i % 2 else 1.2))
        else:
            seed = 100 + i
            seeded[i] = seed
            decoder.add(Job(i, prompt, max_new_tokens=NEW, eos_token_ids=(), seed=seed, **SAMPLED))
    done = {f.job.key: f.result.output_ids for f in decoder.run()}
    for i, seed in seeded.items():
        assert done[i] == plain_seeded(target, texts[i], seed, **SAMPLED), (spec, i)


def test_an_unseeded_request_still_samples_freely(target):
    """Without a seed nothing is keyed: two runs differ (the rejection sampler's own stream)."""
    prompt = torch.tensor([prompts(1)[0]])
    outs = {tuple(plain_generate(target, prompt, max_new_tokens=NEW, eos_token_ids=(), temperature=1.0).output_ids)
            for _ in range(3)}
    assert len(outs) > 1
