"""Exactness of the speculative decoder: greedy identity for every drafter, K and tree; sampling matches plain."""
from __future__ import annotations

import pytest
import torch

from draftsmith.serve.decoding import plain_generate, speculative_generate
from draftsmith.serve.drafters import build_drafter
from draftsmith.serve.drafters.base import Draft, Drafter
from draftsmith.serve.core.target import load_target
from draftsmith.serve.tree import TreeSpec, static_tree_parents
from tests.decoder_fixtures import AnswerTrees

PROMPTS = ["hello hello hello world", "abcabcabcabc", "def f(x):\n    return x", "The quick brown fox"]


@pytest.fixture(scope="module")
def target(tiny_target_dir):
    return load_target(tiny_target_dir)


def encode(target, text):
    return torch.tensor([target.tokenizer.encode(text)])


class RandomTreeDrafter(Drafter):
    """Proposes random trees (and random chains) with a few right guesses: exercises every verify path."""
    kind = "random-tree"

    def __init__(self, target, seed=0, tree=True):
        self.target, self.rng, self.tree = target, torch.Generator().manual_seed(seed), tree

    def begin(self, prompt_ids, next_tokens, hidden_states):
        self.tokens = torch.cat([prompt_ids[:1], next_tokens])

    def commit(self, next_tokens, hidden_states):
        self.tokens = torch.cat([self.tokens, next_tokens])

    def propose(self, k, *, temperature=0.0, generator=None, tree=None):
        # half of the time the true greedy next token of the target is among the children of the root
        logits = self.target.model(self.tokens[None]).logits[0, -1]
        best = int(logits.argmax())
        if not self.tree:
            return Draft(torch.cat([torch.tensor([best]), torch.randint(0, 259, (k - 1,), generator=self.rng)]))
        parents, _ = static_tree_parents(((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0))[: max(k, 1) + 1])
        tokens = torch.randint(0, 259, (len(parents),), generator=self.rng)
        tokens[int(torch.randint(0, 2, (), generator=self.rng))] = best
        return Draft(tokens, parents=torch.tensor(parents))


@pytest.mark.parametrize("k", [1, 3, 5, 8])
@pytest.mark.parametrize("spec", ["ngram", "oracle", "model"])
def test_greedy_identity_chain(target, tiny_target_factory, spec, k):
    if spec == "model":  # another random model with the same tokenizer: drafts that are often wrong
        spec = f"model:{tiny_target_factory('llama', seed=1)}"
    drafter = build_drafter(spec, target)
    for text in PROMPTS:
        ids = encode(target, text)
        ref = plain_generate(target, ids, max_new_tokens=40, eos_token_ids=())
        got = speculative_generate(target, drafter, ids, max_new_tokens=40, k=k, eos_token_ids=())
        assert got.output_ids == ref.output_ids, (spec, k, text)
        assert got.stats.new_tokens == 40 and got.stats.target_forwards == got.stats.cycles + 1
    if spec == "oracle":
        assert got.stats.mu > min(k, 3)  # every draft accepted


@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.parametrize("use_tree", [True, False])
def test_greedy_identity_random_trees(target, k, use_tree):
    drafter = RandomTreeDrafter(target, seed=k, tree=use_tree)
    for text in PROMPTS:
        ids = encode(target, text)
        ref = plain_generate(target, ids, max_new_tokens=30, eos_token_ids=())
        got = speculative_generate(target, drafter, ids, max_new_tokens=30, k=k, eos_token_ids=(), tree=TreeSpec())
        assert got.output_ids == ref.output_ids
        assert got.stats.mu > 1.2


def test_greedy_identity_every_family(tiny_target_factory, family):
    fam_target = load_target(tiny_target_factory(family))
    for spec in ("ngram", "oracle"):
        drafter = build_drafter(spec, fam_target)
        ids = encode(fam_target, PROMPTS[1])
        ref = plain_generate(fam_target, ids, max_new_tokens=24, eos_token_ids=())
        assert speculative_generate(fam_target, drafter, ids, max_new_tokens=24, k=4,
                                    eos_token_ids=()).output_ids == ref.output_ids
    drafter = RandomTreeDrafter(fam_target)
    got = speculative_generate(fam_target, drafter, ids, max_new_tokens=24, k=3, eos_token_ids=(), tree=TreeSpec())
    assert got.output_ids == ref.output_ids
    answers = AnswerTrees({tuple(ids[0].tolist()): ref.output_ids}, rank0_first=True)
    got = speculative_generate(fam_target, answers, ids, max_new_tokens=24, k=3, eos_token_ids=(), tree=TreeSpec())
    assert got.output_ids == ref.output_ids and got.stats.mu > 2.5


def test_eos_inside_accepted_draft_stops_there(target):
    ids = encode(target, PROMPTS[0])
    free = plain_generate(target, ids, max_new_tokens=30, eos_token_ids=()).output_ids
    eos = free[7]  # pretend the 8th greedy token is EOS: the oracle drafts straight through it
    ref = plain_generate(target, ids, max_new_tokens=30, eos_token_ids=(eos,))
    got = speculative_generate(target, build_drafter("oracle", target), ids, max_new_tokens=30, k=8,
                               eos_token_ids=(eos,))
    assert got.output_ids == ref.output_ids and got.output_ids[-1] == eos
    assert len(got.output_ids) == free.index(eos) + 1


def test_stop_string_matches_plain(target):
    ids = encode(target, PROMPTS[2])
    free = plain_generate(target, ids, max_new_tokens=30, eos_token_ids=()).output_ids
    stop = target.tokenizer.decode(free[10:12])
    ref = plain_generate(target, ids, max_new_tokens=30, eos_token_ids=(), stop_strings=(stop,))
    got = speculative_generate(target, build_drafter("oracle", target), ids, max_new_tokens=30, k=5,
                               eos_token_ids=(), stop_strings=(stop,))
    assert got.output_ids == ref.output_ids and len(got.output_ids) <= 12


def test_streamed_tokens_equal_output(target):
    streamed = []
    got = speculative_generate(target, build_drafter("ngram", target), encode(target, PROMPTS[1]),
                               max_new_tokens=25, k=4, eos_token_ids=(), on_tokens=streamed.extend)
    assert streamed == got.output_ids


def test_model_drafter_with_other_tokenizer_is_rejected(target, tmp_path):
    from draftsmith.serve.methods.model.drafter import TokenizerMismatch
    from tests.tiny_models import save_tiny_target, tiny_tokenizer

    folder = save_tiny_target(tmp_path / "other", "llama", vocab_size=260)
    tok = tiny_tokenizer()
    tok.add_tokens(["<extra>"])
    tok.save_pretrained(folder)
    with pytest.raises(TokenizerMismatch, match="different tokenizer"):
        build_drafter(f"model:{folder}", target)


def test_bad_drafter_spec(target):
    from draftsmith.serve.core.errors import DraftsmithError

    with pytest.raises(DraftsmithError, match="unknown drafter"):
        build_drafter("nonsense", target)
    with pytest.raises(DraftsmithError, match="unknown ngram option"):
        build_drafter("ngram:n=3", target)


def test_sliding_window_beyond_the_window(tiny_target_factory):
    """Gemma-style mixed sliding/full layers, generating far past an 8-token window: chain and tree stay exact."""
    target = load_target(tiny_target_factory("gemma", sliding_window=8))
    ids = encode(target, PROMPTS[0])
    ref = plain_generate(target, ids, max_new_tokens=40, eos_token_ids=())
    for tree in (None, TreeSpec()):
        drafter = RandomTreeDrafter(target, tree=tree is not None) if tree else build_drafter("oracle", target)
        got = speculative_generate(target, drafter, ids, max_new_tokens=40, k=4, eos_token_ids=(), tree=tree)
        assert got.output_ids == ref.output_ids


def test_cli_generate_writes_json(tiny_target_dir, tmp_path):
    import json
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path / "g.json"
    proc = subprocess.run([sys.executable, "-m", "draftsmith.cli", "generate", "--target", str(tiny_target_dir),
                           "--drafter", "ngram", "--prompt", "abcabcabc", "--chat", "--k", "3",
                           "--max-new-tokens", "20", "--json", str(out)],
                          capture_output=True, text=True, timeout=120, cwd=Path(__file__).parents[1])
    assert proc.returncode == 0, proc.stderr
    record = json.loads(out.read_text())
    assert {"prompt_token_ids", "output_token_ids", "mu", "target_forwards", "accepted_per_cycle", "seconds"} <= set(record)
    assert "mu=" in proc.stderr
