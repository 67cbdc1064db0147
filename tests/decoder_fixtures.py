"""Shared by the decoder tests (a helper module: test modules import from here, never from each other): the
vocab-8 target whose sampled distribution is enumerated exactly and compared by a chi-square test, and drafters
that exercise the verify paths (trees whose accepted path lies off the first column)."""
from __future__ import annotations

import torch
from scipy.stats import chisquare

from draftsmith.serve.core.sampling import target_probs
from draftsmith.serve.core.target import Target
from draftsmith.serve.drafters.base import Draft, Drafter
from draftsmith.serve.tree import static_tree_parents
from tests.tiny_models import tiny_model, tiny_tokenizer

VOCAB, STEPS, SAMPLES = 8, 3, 1500
PROMPT = torch.tensor([[1, 5, 2, 7, 3]])


def sampling_target() -> Target:
    """A vocab-8 target whose joint over three tokens can be enumerated (512 outcomes)."""
    model = tiny_model("llama", vocab_size=VOCAB, seed=3, eos_token_id=None, pad_token_id=None)
    with torch.no_grad():
        model.lm_head.weight.mul_(0.25)  # flatter p: every cell of the joint gets mass
    return Target(model=model, tokenizer=tiny_tokenizer(), name="tiny-v8", path="")


@torch.inference_mode()
def exact_joint(target, settings) -> dict[tuple, float]:
    probs = {(): 1.0}
    for _ in range(STEPS):
        nxt = {}
        for prefix, mass in probs.items():
            ids = torch.cat([PROMPT, torch.tensor([list(prefix)], dtype=torch.long)], 1)
            p = target_probs(target.model(ids).logits[0, -1], **settings)
            for tok in range(VOCAB):
                if p[tok] > 0:
                    nxt[prefix + (tok,)] = mass * float(p[tok])
        probs = nxt
    return probs


class GreedyTreeDrafter(Drafter):
    """Deterministic top-2 trees from another model: q one-hot per node, differing from p."""
    kind = "tree-test"

    def __init__(self, model, tree):
        self.model, self.tree = model, tree

    def begin(self, prompt_ids, next_tokens, hidden_states):
        self.tokens = torch.cat([prompt_ids[:1], next_tokens])

    def commit(self, next_tokens, hidden_states):
        self.tokens = torch.cat([self.tokens, next_tokens])

    @torch.inference_mode()
    def propose(self, k, *, temperature=0.0, generator=None, tree=None):
        top = self.model(self.tokens[None]).logits[0, -1].topk(2).indices
        if not self.tree:
            return Draft(top[:1].repeat(k))
        a, b = int(top[0]), int(top[1])
        return Draft(torch.tensor([a, b, a, b][: max(2, k + 1)]), parents=torch.tensor([-1, -1, 0, 0][: max(2, k + 1)]))


def chi_square_p(counts: dict, exact: dict, n: int) -> float:
    observed, expected, rest_o, rest_e = [], [], 0, 0.0
    for outcome, mass in exact.items():
        if mass * n >= 5:
            observed.append(counts.get(outcome, 0))
            expected.append(mass * n)
        else:
            rest_o += counts.get(outcome, 0)
            rest_e += mass * n
    assert sum(v for o, v in counts.items() if o not in exact) == 0, "sampled an outcome of probability 0"
    if rest_e > 0:
        observed.append(rest_o)
        expected.append(rest_e)
    scale = sum(observed) / sum(expected)
    return float(chisquare(observed, [e * scale for e in expected]).pvalue)


SETTINGS = [dict(temperature=0.7, top_k=0, top_p=0.9), dict(temperature=1.0, top_k=6, top_p=1.0)]


class AnswerTrees(Drafter):
    """Trees whose first branch is the row's reference answer and whose other branch is random: accepted nodes sit
    off the first column (a kept path that must be moved in the cache), and a mask that lets them see their random
    siblings, or another row's columns, changes the output."""
    kind = "answer-trees"
    SHAPE = ((0,), (1,), (0, 0), (1, 0), (0, 0, 0), (0, 0, 1))

    def __init__(self, answers: dict[tuple, list[int]], *, rank0_first: bool = False):
        self.answers, self.rng, self.done = answers, torch.Generator().manual_seed(0), 0
        self.rank0_first = rank0_first

    def begin(self, prompt_ids, next_tokens, hidden_states):
        self.answer, self.done = self.answers[tuple(prompt_ids.tolist())], 1

    def commit(self, next_tokens, hidden_states):
        self.done += len(next_tokens)

    def propose(self, k, *, temperature=0.0, generator=None, tree=None):
        parents, _ = static_tree_parents(self.SHAPE)
        tokens = torch.randint(0, 256, (len(parents),), generator=self.rng)
        truth = self.answer[self.done: self.done + 3]
        path = (0, 2, 4) if self.rank0_first else (1, 3)  # (1, 3): the random branch comes first
        for node, token in zip(path, truth):
            tokens[node] = token
        return Draft(tokens, parents=torch.tensor(parents))


def sampled_first_tokens(target, drafter, *, samples: int = 600, k: int = 2) -> tuple[float, int]:
    """Speculative sampling at temperature 1 from PROMPT, `samples` times (seeds 0..samples-1): the chi-square p of
    the first three tokens' joint against the target's enumerated one, and how many drafts were accepted."""
    from draftsmith.serve.decoding import speculative_generate

    settings = dict(temperature=1.0, top_k=0, top_p=1.0)
    counts: dict[tuple, int] = {}
    accepted = 0
    for seed in range(samples):
        torch.manual_seed(seed)
        res = speculative_generate(target, drafter, PROMPT, max_new_tokens=3, k=k, eos_token_ids=(), **settings)
        counts[tuple(res.output_ids)] = counts.get(tuple(res.output_ids), 0) + 1
        accepted += sum(res.stats.accepted_per_cycle)
    return chi_square_p(counts, exact_joint(target, settings), samples), accepted
