"""Hybrid targets (linear-attention, Mamba and convolution layers beside attention: Qwen3.5, Qwen3-Next, Nemotron-H,
Granite-4 hybrid, Falcon-H1, LFM2, OLMo-hybrid) and Gemma 4: they load; speculative decoding rolls their recurrent
states back to the last accepted token, at batch 1 (serve/core/kv.py) and per row in a batch
(serve/core/recurrent_slots.py), with output identical to plain greedy decoding and sampling exact in distribution;
EAGLE heads train on them and export where an engine hosts them; trees fall back to chains with one note."""
from __future__ import annotations

import json

import pytest
import torch

from draftsmith.serve.batch.decoder import BatchDecoder, Job
from draftsmith.serve.core.errors import TargetError
from draftsmith.serve.core.families import family_of
from draftsmith.serve.core.kv import (new_cache, records_recurrent_states, recurrent_layer_kinds,
                                     rolls_back_trees)
from draftsmith.serve.core.target import SUPPORTED_MODEL_TYPES, Target, load_target
from draftsmith.serve.decoding import plain_generate, speculative_generate
from draftsmith.serve.drafters import build_drafter
from draftsmith.serve.tree import TreeSpec
from tests.decoder_fixtures import PROMPT, VOCAB, GreedyTreeDrafter, chi_square_p, exact_joint
from tests.tiny_models import HYBRID_FAMILIES, save_tiny_target, tiny_model, tiny_tokenizer

RECURRENT = sorted(f for f in HYBRID_FAMILIES if f != "gemma4")
# transformers 5.25 records a recurrent layer's state per token (what rolling it back needs); older releases are
# refused in one line (test_an_older_transformers_is_refused_in_one_line)
needs_recording = pytest.mark.skipif(not records_recurrent_states(), reason="transformers < 5.25 records no "
                                     "recurrent states")
pytestmark = needs_recording  # hybrid targets need it throughout (README: transformers 5.25 or newer)


@pytest.fixture(scope="module")
def hybrid_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("hybrid")
    return {family: save_tiny_target(root / family, family) for family in HYBRID_FAMILIES}


def repeating_prompts(count: int = 3) -> list[torch.Tensor]:
    """(1, 24) prompts that repeat a random 8-token span three times: the n-gram drafter finds drafts in them (its
    fixed length: an adaptive one reads wall time, and a busy machine may pause it)."""
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(0, 256, (1, 8), generator=gen).repeat(1, 3) for _ in range(count)]


@needs_recording
@pytest.mark.parametrize("family", sorted(HYBRID_FAMILIES))
def test_each_family_loads_and_decodes_exactly_at_batch_1(hybrid_dirs, family):
    target = load_target(hybrid_dirs[family])
    row = family_of(target.config.model_type)
    assert row is not None and row.loads and target.config.model_type in SUPPORTED_MODEL_TYPES
    assert bool(recurrent_layer_kinds(target.model)) == row.recurrent == (family != "gemma4")
    drafted = 0
    for prompt in repeating_prompts():
        plain = plain_generate(target, prompt, max_new_tokens=32)
        spec = speculative_generate(target, build_drafter("ngram:length=fixed", target), prompt, max_new_tokens=32,
                                    k=4)
        assert spec.output_ids == plain.output_ids
        drafted += sum(spec.stats.drafted_per_cycle)
    assert drafted > 0  # drafts were verified and rolled back, or the test proves little


@needs_recording
@pytest.mark.parametrize("family", sorted(HYBRID_FAMILIES))
def test_eagle_heads_train_draft_exactly_and_export_where_an_engine_hosts_them(family, tmp_path):
    """EAGLE-3 and EAGLE-1 heads train on the family's tiny target and draft with output identical to plain greedy
    decoding; every format whose engine hosts the family exports and reads back with the native μ, the others refuse
    in one line naming the engine and what its class lacks (serve/core/families.py)."""
    from draftsmith.serve.export.hosts import HOSTS
    from draftsmith.serve.methods.registry import method as method_of
    from draftsmith.support_matrix import check_family

    result = check_family(family, tmp_path)
    assert result.exact == {"eagle3": (3, 3), "eagle1": (3, 3)}
    for method, verdicts in result.exports.items():
        for fmt, verdict in verdicts.items():
            refusal = HOSTS[fmt].refusal(method_of(method).exports[fmt].hosted_as, result.model_type, None)
            if refusal:
                assert verdict.startswith("refused: ") and refusal in verdict and "\n" not in verdict
            else:
                assert verdict == "ok", (method, fmt, verdict)
                assert result.mu[method][fmt][0] == result.mu[method][fmt][1]


@needs_recording
def test_trees_fall_back_to_chains_once(hybrid_dirs, capsys):
    target = load_target(hybrid_dirs["qwen3_5"])
    assert not rolls_back_trees(new_cache(target.model))
    tree = TreeSpec(depth=3, top_k=2, total_tokens=6)
    other = tiny_model("llama", seed=4)
    for prompt in repeating_prompts(2):
        plain = plain_generate(target, prompt, max_new_tokens=24)
        spec = speculative_generate(target, GreedyTreeDrafter(other, tree=True), prompt, max_new_tokens=24,
                                    k=3, tree=tree)
        assert spec.output_ids == plain.output_ids
    notes = [line for line in capsys.readouterr().err.splitlines() if "verified as chains" in line]
    assert len(notes) == 1 and "qwen3_5_text target has recurrent layers" in notes[0]


@pytest.fixture(scope="module")
def sampling_hybrid() -> Target:
    """A vocab-8 Qwen3.5 target whose joint over three tokens can be enumerated."""
    torch.manual_seed(3)
    model = tiny_model("qwen3_5", vocab_size=VOCAB, seed=3, eos_token_id=None, pad_token_id=None)
    # as built: 25 of the 512 outcomes expect >= 5 of 600 samples, half the mass (the chi-square's cells)
    return Target(model=model, tokenizer=tiny_tokenizer(), name="tiny-qwen3_5-v8", path="")


@needs_recording
def test_sampling_on_a_hybrid_target_matches_its_distribution(sampling_hybrid):
    """A greedy chain of another model (q one-hot, differing from p), rolled back on the recurrent layers whenever
    a draft is rejected: the first three tokens' joint equals the target's enumerated one (chi-square)."""
    settings, samples = dict(temperature=1.0, top_k=0, top_p=1.0), 600
    drafter = GreedyTreeDrafter(tiny_model("llama", vocab_size=VOCAB, seed=11, eos_token_id=None,
                                           pad_token_id=None), tree=False)
    counts: dict[tuple, int] = {}
    accepted = 0
    for seed in range(samples):
        torch.manual_seed(seed)
        res = speculative_generate(sampling_hybrid, drafter, PROMPT, max_new_tokens=3, k=2, eos_token_ids=(),
                                   **settings)
        counts[tuple(res.output_ids)] = counts.get(tuple(res.output_ids), 0) + 1
        accepted += sum(res.stats.accepted_per_cycle)
    assert accepted > samples * 0.1
    assert chi_square_p(counts, exact_joint(sampling_hybrid, settings), samples) > 1e-3


@needs_recording
@pytest.mark.parametrize("family", sorted(HYBRID_FAMILIES))
def test_batched_rows_keep_their_own_states(hybrid_dirs, family):
    """The batched decoder over 2 and 4 slots, 5 requests of mixed lengths (newcomers take freed slots): every row's
    output equals its plain decoding, with the n-gram drafter accepting different counts per row (each row's
    recurrent state returns to its own last accepted token, serve/core/recurrent_slots.py)."""
    target = load_target(hybrid_dirs[family])
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 256, (n,), generator=gen).repeat(3).tolist() for n in (3, 5, 8, 4, 6)]
    plain = [plain_generate(target, torch.tensor([p]), max_new_tokens=20).output_ids for p in prompts]
    for slots, drafter in ((2, None), (2, build_drafter("ngram:length=fixed", target)),
                           (4, build_drafter("ngram:length=fixed", target))):
        decoder = BatchDecoder(target, drafter, slots=slots, k=4)
        for i, prompt in enumerate(prompts):
            decoder.add(Job(i, prompt, max_new_tokens=20))
        done = decoder.run()
        assert [f.result.output_ids for f in done] == plain


@needs_recording
def test_seeded_sampling_and_heads_in_a_batch_equal_plain_decoding(hybrid_dirs):
    """EAGLE-3 drafts (a random head: most are rejected) at temperature 0 and seeded 0.8, a tree asked for and
    verified as chains: each row's tokens are its plain seeded decoding's."""
    from draftsmith.serve.drafters.folder import build_head, make_drafter
    from draftsmith.serve.methods.eagle3.head import eagle3_config

    target = load_target(hybrid_dirs["qwen3_5"])
    torch.manual_seed(5)
    head = build_head(eagle3_config(target))
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 256, (n,), generator=gen).repeat(3).tolist() for n in (3, 5, 8, 4)]
    for temperature, tree in ((0.0, None), (0.8, TreeSpec(depth=3, top_k=2, total_tokens=6))):
        plain = [plain_generate(target, torch.tensor([p]), max_new_tokens=16, temperature=temperature,
                                seed=i).output_ids for i, p in enumerate(prompts)]
        decoder = BatchDecoder(target, make_drafter(head, target, check=False), slots=3, k=3, tree=tree)
        for i, prompt in enumerate(prompts):
            decoder.add(Job(i, prompt, max_new_tokens=16, temperature=temperature, seed=i))
        done = decoder.run()
        assert [f.result.output_ids for f in done] == plain
        assert sum(sum(f.result.stats.drafted_per_cycle) for f in done) > 0


def test_data_build_on_a_hybrid_target_writes_its_answers(hybrid_dirs, tmp_path):
    import datasets

    from draftsmith.data.build import build_dataset
    from tests.data_fixtures import config_for, quiet, write_jsonl

    target = load_target(hybrid_dirs["nemotron_h"])
    prompts = write_jsonl(tmp_path / "prompts.jsonl", [{"id": f"p{i}", "domain": "chat", "prompt": text}
                                                       for i, text in enumerate(["abc abc", "hello", "one two"])])
    result = build_dataset(target, config_for(prompts, max_new_tokens=12, batch_size=2), out_dir=tmp_path / "data",
                           progress=False, log=quiet)
    assert result.rows == 3
    tok = target.tokenizer
    for row in datasets.load_from_disk(str(tmp_path / "data")):
        ids, mask = row["input_ids"], row["loss_mask"]
        prompt = ids[:mask.index(1)]
        answer = plain_generate(target, torch.tensor([prompt]), max_new_tokens=12).output_ids
        assert tok.decode(ids).startswith(tok.decode(prompt) + tok.decode(answer, skip_special_tokens=True))


def test_a_layer_types_list_that_does_not_match_the_layer_count_is_one_line(tmp_path):
    folder = save_tiny_target(tmp_path / "bad", "qwen3_5")
    config = json.loads((folder / "config.json").read_text())
    config["layer_types"] = config["layer_types"][:-1]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(TargetError) as refused:
        load_target(folder)
    assert "\n" not in str(refused.value) and "layer_types" in str(refused.value)


@pytest.mark.parametrize("family", RECURRENT)
def test_every_recurrent_family_is_a_table_row(family):
    from tests.tiny_models import tiny_config

    row = family_of(tiny_config(family).model_type)
    assert row is not None and row.recurrent and row.loads


def test_the_memory_plan_refuses_what_it_does_not_model(hybrid_dirs):
    """A plan of a hybrid or Gemma 4 target would count its recurrent layers and per-layer embeddings as attention:
    `train --plan` refuses in one line (exit 2) instead of printing wrong figures."""
    import subprocess
    import sys

    from draftsmith.serve.core.families import FAMILIES
    from draftsmith.serve.core.target_arch import arch_of
    from tests.tiny_models import MTP_FAMILIES, tiny_config

    assert {row.model_type for row in FAMILIES if not row.planned and row.loads} == {
        tiny_config(family).model_type for family in (*HYBRID_FAMILIES, *MTP_FAMILIES)}
    for family in ("qwen3_5", "gemma4"):
        with pytest.raises(TargetError, match="does not model"):
            arch_of(tiny_config(family))
    done = subprocess.run([sys.executable, "-m", "draftsmith", "train", "--plan", f"target={hybrid_dirs['lfm2']}",
                           "device=cpu"], capture_output=True, text=True, timeout=120)
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 2 and len(errors) == 1 and "'lfm2'" in errors[0]


@needs_recording
def test_bf16_on_a_hybrid_target_is_exact_at_batch_1_and_batched(hybrid_dirs):
    """bf16, where the target runs batch-invariant kernels (serve/core/invariant.py): the recorded verify path of the
    recurrent layers still gives plain decoding's tokens, alone and in a batch."""
    target = load_target(hybrid_dirs["qwen3_5"], dtype="bfloat16")
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 256, (n,), generator=gen).repeat(3).tolist() for n in (3, 5, 8, 4, 6)]
    plain = [plain_generate(target, torch.tensor([p]), max_new_tokens=24).output_ids for p in prompts]
    alone = [speculative_generate(target, build_drafter("ngram:length=fixed", target), torch.tensor([p]),
                                  max_new_tokens=24, k=4).output_ids for p in prompts]
    decoder = BatchDecoder(target, build_drafter("ngram:length=fixed", target), slots=3, k=4)
    for i, prompt in enumerate(prompts):
        decoder.add(Job(i, prompt, max_new_tokens=24))
    assert alone == plain and [f.result.output_ids for f in decoder.run()] == plain


def test_an_older_transformers_is_refused_in_one_line(hybrid_dirs, monkeypatch):
    """Without per-token state recording (transformers < 5.25) speculative decoding on a hybrid target, alone or in
    a batch, stops in one line that says plain decoding still works; plain decoding runs."""
    from draftsmith.serve.core import kv

    target = load_target(hybrid_dirs["qwen3_5"])
    drafters = [build_drafter("ngram", target) for _ in range(2)]
    monkeypatch.setattr(kv, "records_recurrent_states", lambda: False)
    prompt = repeating_prompts(1)[0]
    for attempt in (lambda: speculative_generate(target, drafters[0], prompt, max_new_tokens=8),
                    lambda: BatchDecoder(target, drafters[1], slots=2)):
        with pytest.raises(TargetError) as refused:
            attempt()
        assert "\n" not in str(refused.value) and "plain decoding still works" in str(refused.value)
    assert len(plain_generate(target, prompt, max_new_tokens=8).output_ids) == 8


def test_a_cache_that_cannot_be_cropped_is_refused_in_one_line(monkeypatch):
    """A layer kind whose cache transformers cannot crop (MiniMax's lightning attention, DeepSeek-V4's compressed
    attention): one line naming the layer and its type, and that plain decoding still works."""
    from types import SimpleNamespace

    from draftsmith.serve.core import kv

    class Layer:
        is_croppable = False

    monkeypatch.setattr(kv, "DynamicCache", lambda config: SimpleNamespace(layers=[Layer()]))
    model = SimpleNamespace(config=SimpleNamespace(model_type="minimax", layer_types=["lightning_attention"]))
    with pytest.raises(TargetError, match=r"layer 0 .*\(lightning_attention\) keeps a cache that cannot be rolled "
                                          r"back.*plain decoding still works"):
        kv.new_cache(model)
    assert kv.new_cache(model, rolls_back=False).layers  # plain decoding's cache


@pytest.mark.distributed
def test_capture_over_two_processes_holds_the_whole_hybrid_target_in_each(tmp_path, tiny_target_factory):
    """Data-parallel capture (target.parallel=none, 2 CPU processes) equals one process's; a split (fsdp) is refused
    in one line, before any work (the memory plan does not model the family, and its split is untested)."""
    from tests.sharded_fixtures import CAPTURE, EAGLE3_LAYERS, captured_once, max_difference, torchrun

    target = tiny_target_factory("qwen3_5", num_hidden_layers=EAGLE3_LAYERS)
    dataset, one = captured_once(tmp_path, target, rows=4)
    common = ["-m", "draftsmith.cli", "data", "capture", "--target", str(target), "--dataset", str(dataset)]
    done = torchrun(2, *common, "--out", str(tmp_path / "two"), *CAPTURE, "capture.target.parallel=none")
    assert done.returncode == 0, done.stderr[-3000:]
    assert max_difference(one, tmp_path / "two") == 0.0
    split = torchrun(2, *common, "--out", str(tmp_path / "split"), *CAPTURE, "capture.target.parallel=fsdp")
    errors = {line for line in split.stderr.splitlines() if line.startswith("error:")}
    assert split.returncode != 0 and len(errors) == 1 and "target.parallel=none" in errors.pop()
    assert not (tmp_path / "split" / "manifest.json").exists()


def test_a_drafter_trained_on_one_hybrid_target_refuses_another(tmp_path, hybrid_dirs):
    from draftsmith.serve.core.errors import DraftsmithError
    from draftsmith.serve.drafters.folder import build_head, save_drafter
    from draftsmith.serve.methods.eagle3.head import eagle3_config

    qwen = load_target(hybrid_dirs["qwen3_5"])
    config = eagle3_config(qwen)
    folder = save_drafter(build_head(config), config, tmp_path / "drafter")
    build_drafter(str(folder), qwen)  # its own target: fine
    with pytest.raises(DraftsmithError) as refused:
        build_drafter(str(folder), load_target(hybrid_dirs["qwen3_next"]))
    assert "\n" not in str(refused.value) and "trained for target" in str(refused.value)


def test_a_multimodal_config_without_its_text_model_is_one_line(tmp_path, hybrid_dirs):
    """A Qwen3.5 vision-language config.json that lost its `text_config`: transformers would build its default
    (a 2B-parameter text model) and fail on the weights; one line names what is missing, before any weight loads."""
    import shutil

    folder = tmp_path / "vl"
    shutil.copytree(hybrid_dirs["qwen3_5"], folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen3_5", "architectures":
                                                    ["Qwen3_5ForConditionalGeneration"],
                                                    "vision_config": {}, **{k: config[k] for k in ("eos_token_id",)}}))
    with pytest.raises(TargetError) as refused:
        load_target(folder)
    assert "\n" not in str(refused.value) and "text_config" in str(refused.value)
