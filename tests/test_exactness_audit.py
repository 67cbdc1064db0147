"""The exactness audit (eval/audit.py): a divergence between two tokens the target's precision cannot tell apart is
a rounding flip; anything else is unexplained, and fails `draftsmith eval`."""
from __future__ import annotations

import json

import pytest
import torch

import draftsmith.serve.decoding
from draftsmith.eval.prompts import EvalPrompt
from draftsmith.eval.audit import ROUNDING_FLIP, UNEXPLAINED, audit, classify, reference_dtype, ulp
from draftsmith.serve.core.target import load_target
from draftsmith.serve.decoding import plain_generate
from draftsmith.serve.verify import Verdict, verify_greedy


def test_ulp_and_classify():
    assert ulp(torch.bfloat16, 10.0) == 0.0625 and ulp(torch.bfloat16, -1.0) == 2 ** -7
    assert ulp(torch.float32, 1.0) == 2 ** -23 and ulp(torch.bfloat16, 0.0) == 2 ** -7
    assert classify(0.01, 0.0625) == ROUNDING_FLIP and classify(0.5, 0.0625) == UNEXPLAINED
    assert classify(None, None) == UNEXPLAINED  # an output that ended at another length
    assert reference_dtype(torch.bfloat16) == torch.float32 and reference_dtype(torch.float32) == torch.float64


@pytest.fixture(scope="module")
def twin(tiny_target_dir):
    """A bf16 target (no invariance) whose lm_head gives token 200 the same row as the second greedy token after
    PROMPT: their logits tie exactly in every precision there, and plain decoding keeps the lower id."""
    target = load_target(tiny_target_dir, dtype="bfloat16", invariant="off")
    second = plain_generate(target, PROMPT, max_new_tokens=2, eos_token_ids=()).output_ids[1]
    assert second != 200
    with torch.no_grad():
        target.model.lm_head.weight[200] = target.model.lm_head.weight[second]
    return target, second


PROMPT = torch.tensor([[5, 17, 99, 3, 42, 42, 7]])


def record(prompt, output, name="plain", **extra):
    return {"id": "p0", "drafter": name, "prompt_token_ids": prompt, "output_token_ids": output, **extra}


def test_a_tie_is_a_rounding_flip_and_junk_is_unexplained(twin):
    target, second = twin
    plain = plain_generate(target, PROMPT, max_new_tokens=6, eos_token_ids=()).output_ids
    prompt = PROMPT[0].tolist()
    assert plain[1] == min(second, 200)
    flipped = plain[:1] + [max(second, 200)] + plain[2:]  # the other twin: a tie no precision can break
    records = {"plain": [record(prompt, plain)],
               "flip": [record(prompt, flipped, "flip", first_mismatch=1)],
               "junk": [record(prompt, plain[:3] + [90, 90, 90], "junk", first_mismatch=3)],
               "short": [record(prompt, plain[:4], "short", first_mismatch=4)]}
    found = audit(target, records, ["flip", "junk", "short"], baseline="plain")
    assert found["rounding_flips"] == 1 and found["unexplained"] == 2
    assert found["dtype"] == "bfloat16" and found["reference_dtype"] == "float32"
    flip, junk, short = found["divergences"]
    assert flip["kind"] == ROUNDING_FLIP and flip["gap"] == 0.0 and flip["rounding"] >= 2 ** -7
    assert junk["kind"] == UNEXPLAINED and junk["position"] == 3 and junk["gap"] > junk["rounding"]
    assert short["kind"] == UNEXPLAINED and short["drafter_token"] is None and short["gap"] is None
    json.dumps(found, allow_nan=False)  # the JSON stays strict


def test_eval_fails_on_unexplained_and_reports_rounding_flips(twin, tiny_target_dir, tmp_path, monkeypatch, capsys):
    """The CLI exits 1 only when a divergence is unexplained; rounding flips alone are reported."""
    from draftsmith.cli import main

    target, second = twin

    def swap_twins(tokens, parents, best):  # the verify picks the other twin: what a rounding flip does
        verdict = verify_greedy(tokens, parents, best)
        swapped = max(second, 200) if verdict.next_token == min(second, 200) else verdict.next_token
        return Verdict(verdict.accepted, swapped)

    monkeypatch.setattr("draftsmith.eval.evaluate.load_configured", lambda *a, **k: target)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "x", "domain": "d"}) + "\n")
    monkeypatch.setattr("draftsmith.eval.evaluate.prepare_prompts",
                        lambda tokenizer, rows: [EvalPrompt(id="p0", domain="d", input_ids=PROMPT[0].tolist())])
    monkeypatch.setattr(draftsmith.serve.decoding, "verify_greedy", swap_twins)
    args = ["eval", "--target", str(tiny_target_dir), "--drafter", "ngram", "--prompts", str(prompts),
            "--max-new-tokens", "6", "--no-peers", "--no-cost-model", "--quiet", "bootstrap_samples=20"]
    assert main(args + ["--json", str(tmp_path / "flip.json")]) == 0
    err = capsys.readouterr().err
    assert "0/1 outputs identical to plain greedy decoding: 1 rounding flip" in err
    block = json.loads((tmp_path / "flip.json").read_text())["exactness"]
    assert block["audit"]["by_drafter"]["ngram"] == {"rounding flip": 1, "unexplained": 0}

    def junk(tokens, parents, best):
        verdict = verify_greedy(tokens, parents, best)
        return Verdict(verdict.accepted, 90)

    monkeypatch.setattr(draftsmith.serve.decoding, "verify_greedy", junk)
    assert main(args) == 1
    assert "unexplained by rounding (a bug)" in capsys.readouterr().err


def test_a_sampled_divergence_is_judged_on_the_seeded_scores(twin, monkeypatch):
    """At temperature > 0 the runs are seeded: the audit compares the two tokens' logit / temperature plus the
    position's Gumbel noise. With the noise zeroed the twins tie again (a rounding flip); with the noise a token
    top-k filters out has no score (unexplained), and the seed and the position pick the noise."""
    import draftsmith.eval.audit

    target, second = twin
    prompt = PROMPT[0].tolist()
    plain = plain_generate(target, PROMPT, max_new_tokens=6, eos_token_ids=()).output_ids
    flipped = plain[:1] + [max(second, 200)] + plain[2:]
    records = {"plain": [record(prompt, plain, seed=3)], "flip": [record(prompt, flipped, "flip", first_mismatch=1,
                                                                         seed=3)]}
    sampling = dict(temperature=0.5, top_k=0, top_p=1.0)
    monkeypatch.setattr(draftsmith.eval.audit, "gumbel",
                        lambda seed, position, vocab: torch.zeros(vocab, dtype=torch.float64))
    tied = audit(target, records, ["flip"], baseline="plain", sampling=sampling)["divergences"][0]
    assert tied["kind"] == ROUNDING_FLIP and tied["gap"] == 0.0
    monkeypatch.undo()
    seen = []
    monkeypatch.setattr(draftsmith.eval.audit, "gumbel", lambda seed, position, vocab: seen.append((seed, position))
                        or torch.zeros(vocab, dtype=torch.float64))
    junk = {**records, "junk": [record(prompt, plain[:3] + [90, 90, 90], "junk", first_mismatch=3, seed=4)]}
    filtered = audit(target, junk, ["junk"], baseline="plain", sampling={**sampling, "top_k": 1})
    assert seen == [(4, 3)] and filtered["unexplained"] == 1 and filtered["divergences"][0]["gap"] is None
