"""Gemma 4's assistant as a drafter (serve/methods/gemma4_assistant/): on a tiny Gemma 4 target and a tiny random
Gemma4AssistantForCausalLM saved as transformers saves it, greedy output is plain decoding's at batch 1 (prompts
past the sliding window too), each proposal is transformers' own SinglePositionMultiTokenCandidateGenerator's,
sampling keeps the target's distribution; in the batched decoder (rows drafting together over their rows of the slot
cache) every row proposes what it proposes alone, greedy output is plain decoding's and sampling stays in
distribution; an assistant that cannot draft for the target is one line, and `draftsmith eval --drafter
gemma4_assistant:DIR` reports its exactness."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from draftsmith.serve.batch.decoder import BatchDecoder, Job
from draftsmith.serve.core.target import Target, load_target
from draftsmith.serve.core.target_config import text_config
from draftsmith.serve.decoding import plain_generate, speculative_generate
from draftsmith.serve.drafters import build_drafter
from draftsmith.serve.drafters.spec import DrafterSpecError
from draftsmith.serve.methods.gemma4_assistant.drafter import AssistantDrafter, store_layers
from tests.cli_fixtures import cli_error
from tests.decoder_fixtures import PROMPT, VOCAB, chi_square_p, exact_joint, sampled_first_tokens
from tests.tiny_models import save_tiny_target, tiny_model, tiny_tokenizer

WINDOW = 8  # the sliding window of the main tiny target: prompts and outputs run past it


def assistant_model(target_config, *, seed: int = 1, **overrides):
    """A random Gemma4AssistantForCausalLM for a target of `target_config`: two layers (sliding, full) reading the
    target's store layers, hidden 16 against the target's 32. `overrides` change its assistant config."""
    from transformers import Gemma4AssistantConfig, Gemma4AssistantForCausalLM

    text = text_config(target_config)
    stores = store_layers(text)
    sliding, full = (text.per_layer_config[stores[kind]] for kind in ("sliding_attention", "full_attention"))
    layers = dict(model_type="gemma4_text", vocab_size=text.vocab_size, hidden_size=16, intermediate_size=32,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=sliding.num_key_value_heads,
                  head_dim=sliding.head_dim, global_head_dim=full.head_dim,
                  layer_types=["sliding_attention", "full_attention"], sliding_window=text.sliding_window,
                  hidden_size_per_layer_input=0, vocab_size_per_layer_input=0, num_kv_shared_layers=2,
                  rope_parameters=text.rope_parameters, max_position_embeddings=512, pad_token_id=None,
                  bos_token_id=None, eos_token_id=None)
    layers.update(overrides.pop("text", {}))
    config = Gemma4AssistantConfig(text_config=layers, **{"backbone_hidden_size": text.hidden_size, **overrides})
    torch.manual_seed(seed)
    model = Gemma4AssistantForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(4.0)  # sharper drafts, as the target's (tests/tiny_models.py)
    return model


def save_assistant(folder: Path, target_config, **overrides) -> Path:
    assistant_model(target_config, **overrides).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("assistant")
    target = save_tiny_target(root / "gemma4", "gemma4", sliding_window=WINDOW)
    config = load_target(target, weights=False).config
    return {"target": target, "assistant": save_assistant(root / "assistant", config),
            "llama": save_tiny_target(root / "llama", "llama"), "root": root}


@pytest.fixture(scope="module")
def target(dirs):
    return load_target(dirs["target"])


def prompts() -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(0, 256, (1, n), generator=gen) for n in (3, 7, 20)]  # 20 > WINDOW - 1 from the start


def test_greedy_output_is_plain_decodings_at_batch_1(dirs, target):
    drafter = build_drafter(f"gemma4_assistant:{dirs['assistant']}:length=fixed", target)
    drafted = 0
    for prompt in prompts():
        plain = plain_generate(target, prompt, max_new_tokens=24)
        for k in (1, 3):
            spec = speculative_generate(target, drafter, prompt, max_new_tokens=24, k=k)
            assert spec.output_ids == plain.output_ids
            drafted += sum(spec.stats.drafted_per_cycle)
    assert drafted > 0


def test_accepted_drafts_keep_the_output_exact():
    """A vocabulary of 8: the random assistant's drafts are often the target's argmax, so cycles accept some and the
    drafter resumes after them."""
    target = vocab8_target()
    drafter = AssistantDrafter(assistant_model(target.config), target, folder="tiny")
    accepted = 0
    for prompt in (PROMPT, torch.tensor([[4, 4, 1, 0, 6, 2, 3, 5, 7, 1, 2]])):
        plain = plain_generate(target, prompt, max_new_tokens=20, eos_token_ids=())
        spec = speculative_generate(target, drafter, prompt, max_new_tokens=20, k=3, eos_token_ids=())
        assert spec.output_ids == plain.output_ids
        accepted += sum(spec.stats.accepted_per_cycle)
    assert accepted > 0


class Checked(AssistantDrafter):
    """Compares each proposal with transformers' SinglePositionMultiTokenCandidateGenerator given a fresh forward of
    the target over the text so far (its shared_kv_states and last hidden state)."""

    def begin(self, prompt_ids, next_tokens, hidden_states):
        super().begin(prompt_ids, next_tokens, hidden_states)
        self.text, self.checked = [int(prompt_ids[0])] + next_tokens.tolist(), 0

    def commit(self, next_tokens, hidden_states):
        super().commit(next_tokens, hidden_states)
        self.text += next_tokens.tolist()

    def propose(self, k, **kwargs):
        from transformers import GenerationConfig
        from transformers.generation.candidate_generator import SinglePositionMultiTokenCandidateGenerator

        draft = super().propose(k, **kwargs)
        ids = torch.tensor([self.text])  # (1, seen + 1): the pending token last
        out = self.target_model(ids[:, :-1], return_shared_kv_states=True, output_hidden_states=True)
        generator = SinglePositionMultiTokenCandidateGenerator(self.model, self.embed, GenerationConfig(max_length=999))
        generator.num_assistant_tokens = k
        candidates, _ = generator.get_candidates(ids, model_kwargs={}, model_outputs=out, is_first_iteration=False,
                                                 n_last_matches=0)
        assert draft.tokens.tolist() == candidates[0, ids.shape[1]:].tolist()
        self.checked += 1
        return draft


def test_each_proposal_is_transformers_candidate_generators(tmp_path):
    """Within the sliding window (transformers' generator hands the assistant more of a sliding layer past it)."""
    target = load_target(save_tiny_target(tmp_path / "gemma4", "gemma4"))
    drafter = Checked(assistant_model(target.config), target, folder="tiny")
    drafter.target_model = target.model
    for prompt in prompts():
        plain = plain_generate(target, prompt, max_new_tokens=12)
        assert speculative_generate(target, drafter, prompt, max_new_tokens=12, k=3).output_ids == plain.output_ids
        assert drafter.checked > 0


def vocab8_target() -> Target:
    """tests/decoder_fixtures.py's vocab-8 target, of Gemma 4."""
    # as built: 28 of the 512 outcomes expect >= 5 of 600 samples, half the mass (the chi-square's cells)
    model = tiny_model("gemma4", vocab_size=VOCAB, vocab_size_per_layer_input=VOCAB, seed=3, eos_token_id=None,
                       pad_token_id=None)
    return Target(model=model, tokenizer=tiny_tokenizer(), name="tiny-gemma4-v8", path="")


def test_sampling_matches_the_targets_distribution():
    """Sampled drafts (q the assistant's softmax) verified by rejection sampling: the first three tokens' joint
    equals the target's enumerated one (chi-square)."""
    target = vocab8_target()
    drafter = AssistantDrafter(assistant_model(target.config, seed=2), target, folder="tiny")
    p, accepted = sampled_first_tokens(target, drafter)
    assert accepted > 60 and p > 1e-3


class Logged(AssistantDrafter):
    """Logs every proposal under its row's prompt (the log shared by every fork)."""
    shared_state = (*AssistantDrafter.shared_state, "log")

    def begin(self, prompt_ids, next_tokens, hidden_states):
        super().begin(prompt_ids, next_tokens, hidden_states)
        self.key = tuple(prompt_ids.tolist())

    def _chain(self, k, temperature, generator):
        draft = yield from super()._chain(k, temperature, generator)
        self.log.setdefault(self.key, []).append(draft.tokens.tolist())
        return draft


def test_batched_rows_draft_what_they_draft_alone(dirs, target):
    """Batch 4 over 6 prompts (slots reused, rows moved; lengths on both sides of the sliding window): greedy output
    is plain decoding's, every row's proposals are those it drafts alone at batch 1, and each draft position runs one
    assistant forward for all rows."""
    model = build_drafter(f"gemma4_assistant:{dirs['assistant']}:length=fixed", target).model
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 256, (n,), generator=gen).tolist() for n in (3, 20, 7, 12, 30, 5)]
    alone = Logged(model, target, folder="tiny")
    alone.log = {}
    for prompt in prompts:
        speculative_generate(target, alone, torch.tensor([prompt]), max_new_tokens=16, k=3, eos_token_ids=())
    calls = []
    forward = model.forward
    model.forward = lambda *a, **kw: calls.append(kw["inputs_embeds"].shape[0]) or forward(*a, **kw)
    together = Logged(model, target, folder="tiny")
    together.log = {}
    decoder = BatchDecoder(target, together, slots=4, k=3, costs=False)
    for i, prompt in enumerate(prompts):
        decoder.add(Job(i, prompt, max_new_tokens=16, eos_token_ids=()))
    try:
        done = decoder.run()
    finally:
        del model.forward
    for f, prompt in zip(done, prompts):
        plain = plain_generate(target, torch.tensor([prompt]), max_new_tokens=16, eos_token_ids=())
        assert f.result.output_ids == plain.output_ids
        assert together.log[tuple(prompt)] == alone.log[tuple(prompt)]
    assert max(calls) == 4 and len(calls) <= 3 * decoder.cycles < 3 * decoder.cycle_rows


def test_batched_sampling_matches_the_targets_distribution():
    """Sampled chains of 16 rows drafted together, verified row by row: the first three tokens' joint is the
    target's (chi-square)."""
    target = vocab8_target()
    drafter = AssistantDrafter(assistant_model(target.config, seed=2), target, folder="tiny")
    settings = dict(temperature=1.0, top_k=0, top_p=1.0)
    decoder = BatchDecoder(target, drafter, slots=16, k=2, costs=False)
    torch.manual_seed(0)
    samples = 600
    for i in range(samples):
        decoder.add(Job(i, PROMPT[0].tolist(), max_new_tokens=3, eos_token_ids=(), **settings))
    counts: dict[tuple, int] = {}
    done = decoder.run()
    for f in done:
        counts[tuple(f.result.output_ids)] = counts.get(tuple(f.result.output_ids), 0) + 1
    assert sum(sum(f.result.stats.accepted_per_cycle) for f in done) > 60
    assert chi_square_p(counts, exact_joint(target, settings), samples) > 1e-3


def test_an_assistant_that_cannot_draft_for_the_target_is_one_line(dirs, target):
    root, config = dirs["root"], target.config
    wider = save_assistant(root / "wider", config, backbone_hidden_size=48)
    other_vocab = save_assistant(root / "vocab", config, text=dict(vocab_size=300))
    tokenizer = save_assistant(root / "tokenizer", config)
    other = tiny_tokenizer()
    other.add_tokens(["<extra>"])
    other.save_pretrained(tokenizer)
    cases = {
        f"gemma4_assistant:{wider}": "hidden size 48",
        f"gemma4_assistant:{other_vocab}": "vocabulary of 300",
        f"gemma4_assistant:{tokenizer}": "different tokenizer",
        f"gemma4_assistant:{dirs['llama']}": "not a Gemma 4 assistant",
        f"gemma4_assistant:{root / 'missing'}": "no such Gemma 4 assistant folder",
        f"gemma4_assistant:{dirs['assistant']}:width=3": "unknown gemma4_assistant option",
        "gemma4_assistant": "needs a folder",
    }
    for spec, words in cases.items():
        with pytest.raises(DrafterSpecError) as err:
            build_drafter(spec, target)
        assert words in str(err.value) and "\n" not in str(err.value), (spec, str(err.value))
    llama = load_target(dirs["llama"])
    with pytest.raises(DrafterSpecError, match="drafts for a Gemma 4 target") as err:
        build_drafter(f"gemma4_assistant:{dirs['assistant']}", llama)
    assert "\n" not in str(err.value)


def test_cli_eval_reports_its_exactness(dirs, tmp_path, capsys):
    """At batch 1, and swept to a batch of 4 (the batched decoder), every output is plain decoding's."""
    from draftsmith.cli import main

    prompts_file, out = tmp_path / "p.jsonl", tmp_path / "out.json"
    prompts_file.write_text("".join(json.dumps({"prompt": text, "domain": "d"}) + "\n"
                                    for text in ("hello there, hello there", "a b c d e f g h", "abc", "x y z")))
    spec = f"gemma4_assistant:{dirs['assistant']}:length=fixed"
    code = main(["eval", "--target", str(dirs["target"]), "--drafter", spec, "--prompts", str(prompts_file), "--k", "3",
                 "--max-new-tokens", "12", "--no-peers", "--no-cost-model", "--quiet", "--json", str(out),
                 "--sweep", "batch_size=1,4", "bootstrap_samples=20"])
    assert code == 0
    assert "exactness: 4/4" in capsys.readouterr().out
    data = json.loads(out.read_text())
    assert [d["kind"] for d in data["drafters"]] == ["gemma4_assistant"]
    four = data["sweeps"]["batch_size"][1]
    assert four["value"] == 4 and four["exactness"]["identical"] == four["exactness"]["total"] == 4
    line = cli_error(capsys, "eval", "--target", dirs["llama"], "--drafter", f"gemma4_assistant:{dirs['assistant']}",
                     "--prompts", prompts_file, "--no-peers", "--no-cost-model", "--quiet")
    assert line.startswith("error: ") and "drafts for a Gemma 4 target" in line
