"""Batch-invariant target forwards (serve/core/invariant.py): a token's logits do not depend on how many tokens or
rows are computed with it, so speculative decoding in bfloat16 is token-identical to plain bfloat16 decoding.

Whether a CPU's own kernels round by row count depends on the CPU (a one-row matmul on an AVX512-BF16 EPYC, a
multi-query attention on an AMX Xeon). So that these tests can fail on every machine, `row_count_kernels` swaps
in a linear and an SDPA whose rounding depends on the number of rows and queries, as such kernels do: without
invariance their verify forwards differ from one-token steps, with it they may not."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from draftsmith.serve.batch.decoder import BatchDecoder, Job
from draftsmith.serve.core.errors import TargetError
from draftsmith.serve.core.invariant import (TILE_ROWS, InvariantLinear, apply_invariance, is_invariant, make_invariant,
                                  make_variant, suspended)
from draftsmith.serve.core.kv import cache_kwargs, new_cache, rollback
from draftsmith.serve.core.target import Target, load_target
from draftsmith.serve.core.target_config import TargetConfig
from draftsmith.serve.decoding import plain_generate, speculative_generate
from draftsmith.serve.drafters import build_drafter
from draftsmith.serve.tree import TreeSpec
from tests.decoder_fixtures import (PROMPT, SAMPLES, AnswerTrees, GreedyTreeDrafter, chi_square_p, exact_joint,
                                    sampling_target)
from tests.tiny_models import tiny_model

MAX_NEW = 24


@pytest.fixture
def row_count_kernels(monkeypatch):
    """F.linear and SDPA that round by the number of rows / queries they are called with (one bf16 ulp steps)."""
    linear, sdpa = F.linear, F.scaled_dot_product_attention

    def shaky_linear(x, weight, bias=None):
        rows = x.numel() // x.shape[-1]
        return linear(x, weight, bias) * (1 + (rows % 3) * 2 ** -7)

    def shaky_sdpa(query, *args, **kwargs):
        return sdpa(query, *args, **kwargs) * (1 + (query.shape[-2] % 3) * 2 ** -7)

    monkeypatch.setattr(F, "linear", shaky_linear)
    monkeypatch.setattr(F, "scaled_dot_product_attention", shaky_sdpa)


@pytest.fixture(scope="module")
def bf16(tiny_target_dir):
    return load_target(tiny_target_dir, dtype="bfloat16")


def prompts(n: int, *, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (int(length),), generator=g).tolist()
            for length in torch.randint(3, 40, (n,), generator=g)]


@torch.inference_mode()
def step_and_verify_logits(model, ids: torch.Tensor, context: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(n, V) logits of the last n = len - context tokens: one-token steps, and one forward over all of them."""
    cache = new_cache(model)
    model(ids[:, :context], **cache_kwargs(model, cache))
    steps = torch.stack([model(ids[:, i: i + 1], **cache_kwargs(model, cache)).logits[0, -1]
                         for i in range(context, ids.shape[1])])
    rollback(cache, context)
    return steps, model(ids[:, context:], **cache_kwargs(model, cache)).logits[0]


def test_bf16_is_invariant_by_default_and_float32_is_not(tiny_target_dir, bf16):
    assert is_invariant(bf16.model) and not is_invariant(load_target(tiny_target_dir).model)
    assert not is_invariant(load_target(tiny_target_dir, dtype="bfloat16", invariant="off").model)
    assert is_invariant(load_target(tiny_target_dir, invariant="on").model)
    assert all(type(m) is not torch.nn.Linear for m in bf16.model.modules() if isinstance(m, torch.nn.Linear))


def test_invariant_linear_equals_linear_on_every_row_count():
    torch.manual_seed(0)
    layer = torch.nn.Linear(24, 10).to(torch.bfloat16)
    x = torch.randn(2, 37, 24, dtype=torch.bfloat16)
    expected = torch.cat([F.linear(tile, layer.weight, layer.bias) for tile in
                          torch.cat([x.reshape(-1, 24), x.new_zeros(-74 % TILE_ROWS, 24)]).split(TILE_ROWS)])[:74]
    layer.__class__ = InvariantLinear
    assert torch.equal(layer(x), expected.reshape(2, 37, 10))
    for rows in (1, 5, 16, 17):  # any slice of the rows gives the same rows
        assert torch.equal(layer(x[0, :rows]), expected[:rows])


def test_verify_forwards_equal_one_token_steps_under_row_count_kernels(row_count_kernels):
    model = tiny_model("llama", num_hidden_layers=2).to(torch.bfloat16)
    ids = torch.randint(0, 256, (1, 30), generator=torch.Generator().manual_seed(1))
    steps, verify = step_and_verify_logits(model, ids, 24)
    assert not torch.equal(steps, verify)  # the kernels do round by row count: the test below can fail
    make_invariant(model)
    steps, verify = step_and_verify_logits(model, ids, 24)
    assert torch.equal(steps, verify)
    make_variant(model)
    assert not is_invariant(model) and not any(type(m) is InvariantLinear for m in model.modules())


def test_a_left_padded_batch_prefills_each_row_as_alone(row_count_kernels, bf16):
    rows = prompts(4, seed=3)
    alone = [plain_generate(bf16, torch.tensor([p]), max_new_tokens=8, eos_token_ids=()).output_ids for p in rows]
    decoder = BatchDecoder(bf16, None, slots=4)
    for i, p in enumerate(rows):
        decoder.add(Job(i, p, max_new_tokens=8, eos_token_ids=()))
    assert {f.job.key: f.result.output_ids for f in decoder.run()} == dict(enumerate(alone))


def drafter_for(spec: str, target, tiny_target_factory):
    from draftsmith.serve.methods.eagle1.head import eagle1_config
    from draftsmith.serve.methods.eagle3.head import eagle3_config
    from draftsmith.serve.drafters.folder import build_head, make_drafter
    from draftsmith.serve.methods.hybrid.drafter import HybridDrafter
    from draftsmith.serve.methods.medusa.head import medusa_config
    from draftsmith.serve.methods.ngram.drafter import NgramDrafter

    if spec == "model":
        return build_drafter(f"model:{tiny_target_factory('llama', seed=1)}", target)
    if spec in ("eagle1", "eagle3", "medusa", "hybrid"):
        torch.manual_seed(5)
        config = {"eagle1": lambda: eagle1_config(target), "medusa": lambda: medusa_config(target, num_heads=3)
                  }.get(spec, lambda: eagle3_config(target, aux_layer_ids=[0, 1, 1]))()
        head = build_head(config)
        if spec == "medusa":
            head.init_from_target(target.model.get_output_embeddings().weight)
        drafter = make_drafter(head.to(torch.bfloat16), target, check=False)
        return HybridDrafter(drafter, NgramDrafter(min_n=1)) if spec == "hybrid" else drafter
    return build_drafter(spec, target)


SPECS = ["ngram", "oracle", "model", "eagle1", "eagle3", "medusa", "hybrid"]


@pytest.mark.parametrize("spec", SPECS)
def test_bf16_greedy_identity_every_drafter(row_count_kernels, bf16, tiny_target_factory, spec):
    drafter = drafter_for(spec, bf16, tiny_target_factory)
    for prompt in prompts(3, seed=len(spec)):
        ids = torch.tensor([prompt])
        ref = plain_generate(bf16, ids, max_new_tokens=MAX_NEW, eos_token_ids=())
        for tree in (None, TreeSpec()) if spec in ("eagle3", "medusa") else (None,):
            got = speculative_generate(bf16, drafter, ids, max_new_tokens=MAX_NEW, k=4, eos_token_ids=(), tree=tree)
            assert got.output_ids == ref.output_ids, (spec, tree)


@pytest.mark.parametrize("spec", ["plain", "ngram", "eagle3", "hybrid"])
def test_bf16_batched_greedy_identity(row_count_kernels, bf16, tiny_target_factory, spec):
    rows = prompts(6, seed=11)
    alone = [plain_generate(bf16, torch.tensor([p]), max_new_tokens=MAX_NEW, eos_token_ids=()).output_ids
             for p in rows]
    for slots in (1, 4):
        drafter = None if spec == "plain" else drafter_for(spec, bf16, tiny_target_factory)
        decoder = BatchDecoder(bf16, drafter, slots=slots, k=4)
        for i, p in enumerate(rows):
            decoder.add(Job(i, p, max_new_tokens=MAX_NEW, eos_token_ids=()))
        assert {f.job.key: f.result.output_ids for f in decoder.run()} == dict(enumerate(alone)), (spec, slots)


def test_bf16_answer_trees_off_the_first_column(row_count_kernels, bf16):
    ids = torch.tensor([prompts(1, seed=7)[0]])
    ref = plain_generate(bf16, ids, max_new_tokens=MAX_NEW, eos_token_ids=())
    answers = AnswerTrees({tuple(ids[0].tolist()): ref.output_ids}, rank0_first=False)
    got = speculative_generate(bf16, answers, ids, max_new_tokens=MAX_NEW, k=3, eos_token_ids=(), tree=TreeSpec())
    assert got.output_ids == ref.output_ids and got.stats.mu > 2


def test_bf16_sliding_window_family(row_count_kernels, tiny_target_factory):
    target = load_target(tiny_target_factory("gemma", sliding_window=8), dtype="bfloat16")
    assert is_invariant(target.model)
    rows = prompts(3, seed=2)  # mixed sliding and full layers, far past the 8-token window
    alone = [plain_generate(target, torch.tensor([p]), max_new_tokens=MAX_NEW, eos_token_ids=()).output_ids
             for p in rows]
    for spec in ("ngram", "oracle"):
        for prompt, ref in zip(rows, alone):
            got = speculative_generate(target, build_drafter(spec, target), torch.tensor([prompt]),
                                       max_new_tokens=MAX_NEW, k=4, eos_token_ids=())
            assert got.output_ids == ref, spec
    decoder = BatchDecoder(target, build_drafter("ngram", target), slots=3, k=4)
    for i, p in enumerate(rows):
        decoder.add(Job(i, p, max_new_tokens=MAX_NEW, eos_token_ids=()))
    assert {f.job.key: f.result.output_ids for f in decoder.run()} == dict(enumerate(alone))


def test_bf16_speculative_sampling_matches_the_target_distribution():
    vocab8 = sampling_target()
    model = vocab8.model.to(torch.bfloat16)
    make_invariant(model)
    target = Target(model=model, tokenizer=vocab8.tokenizer, name=vocab8.name, path="")
    other = tiny_model("llama", vocab_size=8, seed=11, eos_token_id=None, pad_token_id=None).to(torch.bfloat16)
    drafter = GreedyTreeDrafter(other, tree=True)
    settings = {"temperature": 0.7, "top_p": 0.9}
    counts: dict[tuple, int] = {}
    for seed in range(SAMPLES):
        out = speculative_generate(target, drafter, PROMPT, max_new_tokens=3, k=2, seed=seed, eos_token_ids=(),
                                   tree=TreeSpec(), **settings).output_ids
        counts[tuple(out)] = counts.get(tuple(out), 0) + 1
    assert chi_square_p(counts, exact_joint(target, settings), SAMPLES) > 1e-3


def test_suspended_runs_the_ordinary_kernels_and_restores(bf16):
    with suspended(bf16.model):
        assert not is_invariant(bf16.model)
    assert is_invariant(bf16.model)


def test_bad_settings_and_targets(tiny_target_dir, tiny_target_factory, capsys):
    with pytest.raises(TargetError, match="target.invariant='sometimes': choose auto, on, off"):
        TargetConfig(invariant="sometimes").validate()
    sinks = tiny_target_factory("gpt_oss")  # attention sinks: no invariant attention
    with pytest.raises(TargetError, match="not available for this target .*attention sinks"):
        load_target(sinks, dtype="bfloat16", invariant="on")
    target = load_target(sinks, dtype="bfloat16")  # auto: says so once, decodes on, the audit takes over
    assert not is_invariant(target.model)
    assert "`draftsmith eval` audits every such divergence" in capsys.readouterr().err
    assert apply_invariance(target.model, "off") is False
    moe = load_target(tiny_target_factory("qwen3_moe"), dtype="bfloat16")  # fused experts: not invariant, said so
    assert not is_invariant(moe.model) and "experts multiply" in capsys.readouterr().err


def test_a_dtype_the_device_cannot_run_is_refused_before_loading(tiny_target_dir, monkeypatch):
    linear = F.linear

    def no_half(x, weight, bias=None):
        if x.dtype == torch.float16:
            raise RuntimeError('"addmm_impl_cpu_" not implemented for \'Half\'')
        return linear(x, weight, bias)

    monkeypatch.setattr(F, "linear", no_half)
    with pytest.raises(TargetError, match="cpu cannot compute in torch.float16: .* use target.dtype=float32"):
        load_target(tiny_target_dir, dtype="float16")


def test_the_cost_of_invariance_is_measured_side_by_side(tiny_target_dir, bf16):
    from draftsmith.eval.costs import invariance_costs
    from draftsmith.eval.report import invariance_lines

    context = torch.randint(0, 256, (1, 32), generator=torch.Generator().manual_seed(0))
    costs = invariance_costs(bf16.model, context, [1, 5], repeats=2)
    assert is_invariant(bf16.model)  # left as it came
    assert set(costs) == {"invariant", "ordinary", "slowdown"} and costs["slowdown"][5] > 0
    line = invariance_lines(costs, {"invariant": True, "dtype": "bfloat16"})[1]
    assert line.startswith("Batch-invariant target forwards (on; bfloat16): a 1-token step costs") and "5 tokens" in line
    assert invariance_costs(load_target(tiny_target_dir).model, context, [1, 5], repeats=1) is None  # float32


def test_transformers_generate_on_an_invariant_target_matches_ours(row_count_kernels, bf16):
    """A prompt's prefill runs whole whoever calls the model: transformers' greedy generate and its prompt lookup
    give our plain decoder's tokens."""
    for prompt in prompts(3, seed=5):
        ids = torch.tensor([prompt])
        ours = plain_generate(bf16, ids, max_new_tokens=MAX_NEW, eos_token_ids=()).output_ids
        for extra in ({}, {"prompt_lookup_num_tokens": 3}):
            theirs = bf16.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_NEW,
                                         min_new_tokens=MAX_NEW, do_sample=False, eos_token_id=None, **extra)
            assert theirs[0, ids.shape[1]:].tolist() == ours, extra


@pytest.mark.slow
def test_default_target_in_bf16_scores_a_verify_as_its_steps(demo_target_dir):
    """The real default target in bf16: a verify forward over 6 tokens gives the logits of 6 one-token steps, bit
    for bit (on an AMX Xeon without invariance 74 of 96 such rows differed), and speculative greedy output equals
    plain greedy output."""
    from draftsmith.serve.core.prompts import encode_prompt

    target = load_target(demo_target_dir, dtype="bfloat16")
    assert is_invariant(target.model)
    ids = torch.tensor([encode_prompt(target.tokenizer, "Name three rivers of Europe and their lengths.", chat=True)])
    plain = plain_generate(target, ids, max_new_tokens=20, eos_token_ids=()).output_ids
    steps, verify = step_and_verify_logits(target.model, torch.cat([ids, torch.tensor([plain[:6]])], 1),
                                           ids.shape[1])
    assert torch.equal(steps, verify)
    got = speculative_generate(target, build_drafter("ngram", target), ids, max_new_tokens=20, k=5, eos_token_ids=())
    assert got.output_ids == plain
