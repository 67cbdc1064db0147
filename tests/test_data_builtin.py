"""The built-in prompt sets (data/builtin/*.jsonl): every domain loads through the project's own loader,
with the shape its domain promises, and fits the default target's context with room for the answers."""
import json

import pytest

from draftsmith.data.builtin import BUILTIN_DOMAINS, builtin_files
from draftsmith.data.prompts import load_prompts

MAX_PROMPT_TOKENS = 1000  # a 135M target attempts these; an answer of max_new_tokens must still fit after


def _file_records(domain: str) -> list[dict]:
    (path,) = builtin_files(domain)
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _user_turns(row) -> list[str]:
    return [m["content"] for m in row.messages if m["role"] == "user"]


@pytest.mark.parametrize("domain", BUILTIN_DOMAINS)
def test_each_domain_loads_with_its_own_ids_and_domain(domain):
    rows = load_prompts(f"builtin:{domain}")
    assert 50 <= len(rows) <= 80, len(rows)
    assert {r.domain for r in rows} == {domain}
    # ids number the rows in file order: a domain only grows at its end, so the rows a built dataset
    # holds keep their ids, and the demo's held-out rows are always the last ones
    assert [r.id for r in rows] == [f"{domain}-{i:02d}" for i in range(1, len(rows) + 1)]
    assert all(record["domain"] == domain for record in _file_records(domain))  # explicit, not by fallback
    assert all(_user_turns(r) and all(t.strip() for t in _user_turns(r)) for r in rows)


def test_all_domains_together_have_unique_ids_and_texts():
    rows = load_prompts("builtin")
    assert [r.domain for r in rows] == [d for d in BUILTIN_DOMAINS for _ in load_prompts(f"builtin:{d}")]
    assert len({r.id for r in rows}) == len(rows)
    texts = [json.dumps(r.messages, sort_keys=True) for r in rows]
    assert len(set(texts)) == len(texts)  # no prompt twice, in one domain or across two


def test_multiturn_rows_are_two_or_three_user_turns():
    rows = load_prompts("builtin:multiturn")
    assert all(2 <= len(_user_turns(r)) <= 3 and len(r.messages) == len(_user_turns(r)) for r in rows)


def test_rag_rows_carry_short_context():
    for row in load_prompts("builtin:rag"):
        (text,) = _user_turns(row)
        assert "Context:" in text or "Text A:" in text, row.id
        assert len(text.split()) <= 150, (row.id, len(text.split()))  # passages and question together


def test_roleplay_rows_set_a_persona():
    personas = ("you are", "pretend", "act as", "role-play")
    for row in load_prompts("builtin:roleplay"):
        system = [m["content"] for m in row.messages if m["role"] == "system"]
        assert system or _user_turns(row)[0].lower().startswith(personas), row.id


@pytest.mark.slow
def test_every_prompt_renders_in_the_default_target_template(demo_target_dir):
    """Each row as the target is prompted with it (all its turns, through SmolLM2's chat template)."""
    from transformers import AutoTokenizer

    from draftsmith.data.masks import render_prompt

    tokenizer = AutoTokenizer.from_pretrained(demo_target_dir)
    lengths = {r.id: len(render_prompt(tokenizer, r.messages)) for r in load_prompts("builtin")}
    assert len(lengths) >= 50 * len(BUILTIN_DOMAINS)
    too_long = {i: n for i, n in lengths.items() if n >= MAX_PROMPT_TOKENS}
    assert not too_long, too_long
