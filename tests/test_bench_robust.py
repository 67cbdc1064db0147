"""The robustness benchmark's prompt sets (scripts/bench/robust.py): each public set a group of `set/domain`s, at most
`limit` prompts a domain, Spec-Bench's categories folded into its six domains, and the hybrid-against-its-parts line."""
from __future__ import annotations

import json

import pytest

from draftsmith.bench import robust


def _write(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture
def shared(tmp_path, monkeypatch):
    root = tmp_path / "shared" / "data"
    _write(root / "eval/gsm8k_test.jsonl", [{"question": f"What is {i} + {i}?"} for i in range(4)])
    _write(root / "eval/humaneval.jsonl", [{"task_id": f"HumanEval/{i}", "prompt": f"def f{i}(x):\n"} for i in range(4)])
    _write(root / "train/prompts.jsonl", [{"id": f"t{i}", "domain": d, "prompt": f"{d} {i}"}
                                          for i in range(3) for d in ("general", "roleplay", "code")])
    monkeypatch.setattr(robust, "SHARED", root)
    spec = tmp_path / "question.jsonl"
    _write(spec, [{"question_id": i, "category": c, "turns": [f"{c} question {i}"]}
                  for i, c in enumerate(["writing", "roleplay", "translation", "translation", "translation", "rag"])])
    return spec


def test_every_set_is_a_group_of_domains_capped_per_domain(shared, tmp_path):
    held = tmp_path / "held.jsonl"
    _write(held, [{"id": f"h{i}", "domain": "chat", "prompt": f"hi {i}"} for i in range(5)])
    rows = robust.public_rows(2, str(shared), str(held))
    domains = [r.domain for r in rows]
    assert {d.split("/")[0] for d in domains} == {"gsm8k", "humaneval", "gpteacher", "specbench", "demo"}
    assert all(domains.count(d) <= 2 for d in set(domains))
    assert "gpteacher/code" not in domains  # only the roleplay and general prompts: the demo trains on code
    # Spec-Bench's MT-bench categories fold into one multi-turn domain; its tasks keep their names
    assert domains.count("specbench/multiturn") == 2 and domains.count("specbench/translation") == 2
    assert "specbench/rag" in domains and len({r.id for r in rows}) == len(rows)
    assert not any(d.startswith("specbench") for d in (r.domain for r in robust.public_rows(2, None, None)))


def test_a_run_takes_the_sets_asked_for_and_never_drops_one_silently(shared, tmp_path, monkeypatch, capsys):
    held = tmp_path / "held.jsonl"
    _write(held, [{"id": "h0", "domain": "chat", "prompt": "hi"}])
    rows = robust.public_rows(2, str(shared), str(held), sets=("demo", "gsm8k"))
    assert {r.domain.split("/")[0] for r in rows} == {"demo", "gsm8k"}
    assert robust.held_out_file(str(held)) == str(held)
    with pytest.raises(SystemExit, match="no such file"):  # a set asked for by name and absent is an error
        robust.held_out_file(str(tmp_path / "absent.jsonl"))
    monkeypatch.setattr(robust, "HELD_OUT", tmp_path / "no-demo-ran.jsonl")
    assert robust.held_out_file(None) is None and "no demo held-out set" in capsys.readouterr().err
    monkeypatch.setattr(robust, "HELD_OUT", held)
    assert robust.held_out_file(None) == str(held)


def test_the_hybrid_is_held_to_the_better_of_its_parts():
    block = {"ngram": {"mu": 2.0, "speedup": 1.5}, "head": {"mu": 1.2, "speedup": 1.1},
             "hybrid": {"mu": 2.2, "speedup": 1.2}}
    result = {"overall": block, "domains": {"copy": block}}
    assert robust.hybrid_holds(result, "hybrid", ("ngram", "head"), None) == \
        "μ 1.10 of the better part, speedup 0.80"
