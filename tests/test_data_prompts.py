"""Prompt sources: the five forms (plus ShareGPT), domains, built-in sets, HF datasets folders, bad input."""
from __future__ import annotations

import pytest

from draftsmith.data.builtin import BUILTIN_DOMAINS
from draftsmith.data.prompts import PromptRow, load_prompts
from draftsmith.serve.core.errors import DraftsmithError
from tests.data_fixtures import write_jsonl


def test_five_forms_and_domains(tmp_path):
    src = write_jsonl(tmp_path / "p.jsonl", [
        {"id": "m", "domain": "chat", "messages": [{"role": "system", "content": "Be brief."},
                                                    {"role": "user", "content": "Hi"},
                                                    {"role": "assistant", "content": "Hello"},
                                                    {"role": "user", "content": "Bye"}]},
        {"turns": ["one", "two"], "category": "writing"},
        {"prompt": "p", "domain": "code"},
        "",
        {"question": "q?", "task_id": "T/1"},
        {"instruction": "Do it", "input": "on this", "domain": ""},
        {"instruction": "Just this", "input": ""},
        {"conversations": [{"from": "human", "value": "a"}, {"from": "gpt", "value": "b"}]},
        {"prompt": "with system", "system": "You are terse."},
    ])
    rows = load_prompts(src)
    assert all(isinstance(r, PromptRow) for r in rows)
    by_id = {r.id: r for r in rows}
    assert [m["role"] for m in by_id["m"].messages] == ["system", "user", "assistant", "user"]
    assert by_id["m"].domain == "chat"
    assert rows[1].messages == [{"role": "user", "content": "one"}, {"role": "user", "content": "two"}]
    assert rows[1].domain == "writing"  # falls back to `category`
    assert rows[2].messages == [{"role": "user", "content": "p"}] and rows[2].domain == "code"
    assert by_id["T/1"].messages == [{"role": "user", "content": "q?"}] and by_id["T/1"].domain == "default"
    assert rows[4].messages[0]["content"] == "Do it\n\non this" and rows[4].domain == "default"
    assert rows[5].messages[0]["content"] == "Just this"
    assert rows[6].messages == [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    assert rows[7].messages[0] == {"role": "system", "content": "You are terse."}
    assert len({r.id for r in rows}) == len(rows)
    assert [r.domain for r in load_prompts(src, domain_field="category")][:2] == ["default", "writing"]
    assert len(load_prompts(src, limit=3)) == 3


@pytest.mark.parametrize("line, message", [
    ("{not json", r"p\.jsonl:2: not valid JSON"),
    ('{"text": "x"}', r"p\.jsonl:2: row has none of messages.*keys: text"),
    ('{"prompt": ""}', r"p\.jsonl:2: `prompt` is empty"),
    ('{"messages": [{"role": "bot", "content": "x"}]}', r"p\.jsonl:2: .*role 'bot'"),
    ('{"messages": [{"role": "assistant", "content": "x"}]}', r"p\.jsonl:2: .*no user turn"),
    ('["a"]', r"p\.jsonl:2: a row must be a JSON object"),
])
def test_malformed_line_names_file_and_line(tmp_path, line, message):
    src = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "fine"}, line])
    with pytest.raises(DraftsmithError, match=message):
        load_prompts(src)


def test_empty_and_missing_sources(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(DraftsmithError, match="no prompts in .*empty.jsonl"):
        load_prompts(empty)
    with pytest.raises(DraftsmithError, match="not found"):
        load_prompts(tmp_path / "nope.jsonl")
    with pytest.raises(DraftsmithError, match="no built-in prompt set 'poetry'"):
        load_prompts("builtin:poetry")


def test_builtin_sets_are_complete():
    rows = load_prompts("builtin")
    domains = {d: [r for r in rows if r.domain == d] for d in BUILTIN_DOMAINS}
    assert set(r.domain for r in rows) == set(BUILTIN_DOMAINS)
    assert all(50 <= len(v) <= 80 for v in domains.values()), {d: len(v) for d, v in domains.items()}
    assert len({r.id for r in rows}) == len(rows)
    assert any(len([m for m in r.messages if m["role"] == "user"]) > 1 for r in domains["chat"])  # multi-turn
    assert [r.domain for r in load_prompts("builtin:math")] == ["math"] * len(domains["math"])


def test_hf_datasets_folder(tmp_path):
    import datasets

    folder = tmp_path / "ds"
    datasets.DatasetDict({"test": datasets.Dataset.from_dict(
        {"question": ["a?", "b?"], "category": ["x", "y"]})}).save_to_disk(str(folder))
    rows = load_prompts(folder, split="test")
    assert [(r.domain, r.messages[0]["content"]) for r in rows] == [("x", "a?"), ("y", "b?")]
    with pytest.raises(DraftsmithError, match="no split 'train'"):
        load_prompts(folder)


def test_shared_training_prompts_load_fast():
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "shared" / "data" / "train" / "prompts.jsonl"
    if not path.is_file():
        pytest.skip("shared prompt sets not present")
    rows = load_prompts(path, limit=50)
    assert len(rows) == 50 and rows[0].id == "seed_task_0" and rows[0].domain == "general"
