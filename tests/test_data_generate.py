"""Continuous batching for self-distillation: every answer equals plain decoding of its prompt alone."""
from __future__ import annotations

import torch

from draftsmith.data.generate import Answer, ContinuousBatcher, Request
from draftsmith.serve.core.target_masks import config_masks
from draftsmith.serve.decoding import plain_generate
from draftsmith.serve.core.target import load_target

MAX_NEW = 24


def random_prompts(n: int, *, seed: int = 0, longest: int = 80) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, longest, (n,), generator=g).tolist()
    return [torch.randint(0, 256, (length,), generator=g).tolist() for length in lengths]


def plain(target, prompt, **kw) -> Answer:
    ids = plain_generate(target, torch.tensor([prompt]), max_new_tokens=MAX_NEW, **kw).output_ids
    return Answer(token_ids=ids, finished=ids[-1] in target.eos_token_ids)


def run(batcher: ContinuousBatcher) -> dict:
    answers = {}
    while batcher.busy:
        for request, answer in batcher.step():
            answers[request.key] = answer
    return answers


def test_greedy_answers_equal_plain_decoding(family, tiny_target_factory):
    # gemma's sliding window is 64: prompts up to 80 tokens plus the answers run past it
    target = load_target(tiny_target_factory(family))
    prompts = random_prompts(9)
    expected = [plain(target, p) for p in prompts]
    for slots in (1, 3, 16):  # one row at a time, refilled slots, every row at once
        batcher = ContinuousBatcher(target, slots=slots, max_new_tokens=MAX_NEW)
        for i, prompt in enumerate(prompts):
            batcher.add(Request(key=i, prompt=prompt))
        answers = run(batcher)
        assert [answers[i] for i in range(len(prompts))] == expected, slots
        assert batcher.running == 0 and not batcher.busy


def test_eos_ends_a_row_and_its_slot_is_reused(tiny_target_dir):
    target = load_target(tiny_target_dir)
    eos = target.eos_token_ids[0]
    with torch.no_grad():  # a model that always ends at once: the first token of every answer is EOS
        target.model.lm_head.bias = torch.nn.Parameter(torch.zeros(target.model.config.vocab_size))
        target.model.lm_head.bias[eos] = 1e4
    batcher = ContinuousBatcher(target, slots=2, max_new_tokens=MAX_NEW)
    for i, prompt in enumerate(random_prompts(5)):
        batcher.add(Request(key=i, prompt=prompt))
    steps, answers = 0, {}
    while batcher.busy:
        answers.update((request.key, answer) for request, answer in batcher.step())
        steps += 1
    assert answers == {i: Answer([eos], True) for i in range(5)}
    assert steps == 3  # three prefills of 2 + 2 + 1 newcomers, no decode step


def test_follow_up_requests_go_first_and_grow_the_cache(tiny_target_dir):
    target = load_target(tiny_target_dir)
    short, longer = random_prompts(1, longest=10, seed=1)[0], random_prompts(1, longest=150, seed=2)[0]
    batcher = ContinuousBatcher(target, slots=1, max_new_tokens=MAX_NEW)
    for i in range(3):
        batcher.add(Request(key=i, prompt=short))
    while True:
        if 0 in [request.key for request, _ in batcher.step()]:
            break
    batcher.add(Request(key="follow-up", prompt=longer), first=True)
    batcher.step()
    assert "follow-up" in [row.job.key.key for row in batcher.decoder.rows]
    assert [request.key for request in batcher.queue] == [1, 2]
    assert batcher.decoder.cache.capacity >= len(longer) + MAX_NEW
    answers = run(batcher)
    assert answers["follow-up"] == plain(target, longer)


def test_sampling_is_per_request_and_independent_of_the_batch(tiny_target_dir):
    target = load_target(tiny_target_dir)
    prompts = random_prompts(6, seed=3)
    settings = dict(temperature=0.9, top_k=20, top_p=0.95)
    results = []
    for slots in (1, 4):
        batcher = ContinuousBatcher(target, slots=slots, max_new_tokens=MAX_NEW, **settings)
        for i, prompt in enumerate(prompts):
            batcher.add(Request(key=i, prompt=prompt, seed=100 + i))
        results.append(run(batcher))
    assert results[0] == results[1]
    # each answer is the one plain decoding samples with the same seed
    assert [results[1][i] for i in range(6)] == [plain(target, p, seed=100 + i, **settings)
                                                for i, p in enumerate(prompts)]
    assert len({tuple(a.token_ids) for a in results[0].values()}) > 1


def test_attention_masks_per_layer_type(tiny_target_factory):
    allowed = torch.ones(1, 1, 1, 10, dtype=torch.bool)
    q, k = torch.tensor(9).view(1, 1, 1, 1), torch.arange(10).view(1, 1, 1, 10)
    llama = load_target(tiny_target_factory("llama")).config
    assert torch.equal(config_masks(llama, allowed, q, k), allowed)
    gemma = load_target(tiny_target_factory("gemma")).config
    gemma.sliding_window = 4
    masks = config_masks(gemma, allowed, q, k)
    assert masks["full_attention"].all() and masks["sliding_attention"][0, 0, 0].tolist() == [False] * 6 + [True] * 4


def test_one_window_rule_for_both_caches():
    """The batch-1 decoder's DynamicCache keeps a sliding layer's last window - 1 positions, the batched decoder's
    slot cache all of them: one rule (serve/core/target_masks.window_masks) gives both the same visible keys."""
    from draftsmith.serve.core.target_masks import window_masks

    q, k = torch.tensor([10, 11]).view(2, 1), torch.arange(12).view(1, 12)  # 10 past positions, 2 queries
    allowed = (k <= q)[None, None]  # (1, 1, 2, 12) causal
    slot = window_masks(allowed, q, k, window=4, all_sliding=False)
    held = window_masks(allowed, q, k, window=4, all_sliding=False, sliding_from=10 - 3)
    assert torch.equal(held["full_attention"], allowed) and torch.equal(held["sliding_attention"],
                                                                           slot["sliding_attention"][..., 7:])
    assert not slot["sliding_attention"][..., :7].any()  # what the DynamicCache dropped no query could see
    assert slot["sliding_attention"][0, 0].sum(-1).tolist() == [4, 4]  # each query sees itself and 3 behind
    assert torch.equal(window_masks(allowed, q, k, window=None, all_sliding=True), allowed)


def test_greedy_rows_equal_the_former_generate_batches(tiny_target_dir):
    # the path `data build` took before continuous batching: transformers' generate over left-padded batches
    from draftsmith.bench.generate import continuous_generate, former_generate

    target = load_target(tiny_target_dir)
    prompts = random_prompts(10, seed=4)
    former = former_generate(target, prompts, batch_size=4, max_new_tokens=MAX_NEW)
    assert continuous_generate(target, prompts, slots=4, max_new_tokens=MAX_NEW) == former
    assert continuous_generate(target, prompts, slots=3, max_new_tokens=MAX_NEW) == former


def test_grouped_attention_gives_the_answers_of_sdpa(family, tiny_target_factory, monkeypatch):
    """Self-distillation's steps on grouped matmuls (serve/core/attention.py, taken on a CPU in bf16) forced here in
    float32, where they must reproduce plain decoding's answers through the slot cache, its masks and windows."""
    import draftsmith.serve.core.attention as attention

    target = load_target(tiny_target_factory(family))
    prompts = random_prompts(6, seed=1)
    expected = [plain(target, p) for p in prompts]
    calls = []
    grouped = attention.grouped_attention
    monkeypatch.setattr(attention, "grouped_wanted", lambda model: True)
    monkeypatch.setattr(attention, "grouped_attention", lambda *a, **k: calls.append(a[1].shape[2]) or grouped(*a, **k))
    batcher = ContinuousBatcher(target, slots=4, max_new_tokens=MAX_NEW)
    for i, prompt in enumerate(prompts):
        batcher.add(Request(key=i, prompt=prompt))
    answers = run(batcher)
    assert [answers[i] for i in range(len(prompts))] == expected
    assert (1 in calls) == (target.model.config._attn_implementation == "sdpa")  # the one-token steps took it
    assert target.model.config._attn_implementation != attention.GROUPED  # restored after every step
