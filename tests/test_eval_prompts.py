"""Evaluation prompts: every row form, domain labels and grouping, per-domain limits, rendering, drafter specs."""
from __future__ import annotations

import json

import pytest

from draftsmith.data.prompts import read_prompts, split_label
from draftsmith.eval.prompts import group_by_domain, prepare_prompts, render_prompt
from draftsmith.serve.drafters.spec import parse_named_specs
from draftsmith.serve.core.errors import DraftsmithError
from tests.tiny_models import tiny_tokenizer

ROWS = [
    {"id": "m", "domain": "chat", "messages": [{"role": "system", "content": "be brief"},
                                               {"role": "user", "content": "hi"},
                                               {"role": "assistant", "content": "hello"},
                                               {"role": "user", "content": "again"},
                                               {"role": "assistant", "content": "a reply to drop"}]},
    {"id": "t", "category": "writing", "turns": ["first turn", "second turn"]},
    {"id": "p", "domain": "code", "prompt": "def f():"},
    {"question": "2+2?", "domain": "math"},
    {"instruction": "Summarize.", "input": "Some text.", "kind": "summarization"},
    {"id": "p2", "domain": "code", "prompt": "class A:"},
]


@pytest.fixture()
def prompt_file(tmp_path):
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in ROWS) + "\n")
    return path


def test_every_form_and_domain_grouping(prompt_file):
    rows = read_prompts([str(prompt_file)])
    assert [r.domain for r in rows] == ["chat", "writing", "code", "math", "default", "code"]
    rows = read_prompts([str(prompt_file)], domain_field="kind")
    assert rows[4].domain == "summarization" and rows[1].domain == "writing"  # falls back to `category`
    assert group_by_domain(rows) == {"default": [0, 2, 3, 5], "writing": [1], "summarization": [4]}


def test_domain_labels_limits_and_unique_ids(prompt_file, tmp_path):
    plain = tmp_path / "plain.jsonl"
    plain.write_text(json.dumps({"question": "why?"}) + "\n" + json.dumps({"question": "how?"}) + "\n")
    assert split_label(f"qa={plain}") == ("qa", str(plain)) and split_label(str(plain)) == (None, str(plain))
    rows = read_prompts([f"qa={plain}", str(prompt_file), f"qa={plain}"], per_domain_limit=1)
    assert [(r.domain, r.id) for r in rows] == [("qa", "plain-0"), ("chat", "m"), ("writing", "t"), ("code", "p"),
                                                ("math", "mixed-3"), ("default", "mixed-4")]
    rows = read_prompts([f"qa={plain}", f"qa={plain}"])
    assert [r.id for r in rows] == ["plain-0", "plain-1", "plain-0#1", "plain-1#1"]
    with pytest.raises(DraftsmithError):
        read_prompts([str(prompt_file)], per_domain_limit=0)


def test_render_with_and_without_chat_template(prompt_file):
    rows = read_prompts([str(prompt_file)])
    chat = tiny_tokenizer()
    text = chat.decode(render_prompt(chat, rows[0].messages))
    # up to the last user turn, then the generation prompt; the trailing assistant answer is dropped
    assert text.endswith("<|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\n")
    assert "be brief" in text and "a reply to drop" not in text
    assert chat.decode(render_prompt(chat, rows[1].messages)).count("<|im_start|>user") == 2
    base = tiny_tokenizer(chat_template=None)
    # a base model: the plain text of every turn up to the last user one, as data build trained it (not that turn
    # alone: a multi-turn prompt evaluated on other text than the model learned from)
    from draftsmith.data.masks import render_with_mask
    from draftsmith.eval.prompts import prompt_messages

    ids = render_prompt(base, rows[0].messages)
    trained, _ = render_with_mask(base, prompt_messages(rows[0].messages), chat=False)
    assert ids == trained and base.decode(ids).endswith("\n\nagain") and "be brief" in base.decode(ids)
    prompts = prepare_prompts(base, rows)
    assert [p.id for p in prompts] == [r.id for r in rows] and all(p.input_ids for p in prompts)
    with pytest.raises(DraftsmithError, match="no user turn"):
        render_prompt(chat, [{"role": "system", "content": "x"}])


def test_builtin_sources_have_domains():
    rows = read_prompts(["builtin:code", "builtin:math"], per_domain_limit=2)
    assert [r.domain for r in rows] == ["code", "code", "math", "math"]


def test_drafter_spec_names(tmp_path):
    folder = tmp_path / "my_eagle"
    folder.mkdir()
    specs = parse_named_specs(["ngram", "ngram:max_n=2", "model:/x/small-lm", str(folder), "best=oracle"])
    assert specs == {"ngram": "ngram", "ngram:max_n=2": "ngram:max_n=2", "model:small-lm": "model:/x/small-lm",
                     "my_eagle": str(folder), "best": "oracle"}
    with pytest.raises(DraftsmithError, match="two drafters"):
        parse_named_specs(["ngram", "ngram"])


def test_one_prompt_encoder_for_every_command():
    """generate, eval, the server and data build encode one user prompt the same way (serve/core/prompts.py)."""
    from draftsmith.data.masks import render_prompt as data_render
    from draftsmith.serve.core.prompts import encode_prompt

    chat, base = tiny_tokenizer(), tiny_tokenizer(chat_template=None)
    user = [{"role": "user", "content": "hi there"}]
    assert encode_prompt(chat, "hi there") == data_render(chat, user) == render_prompt(chat, user)
    assert encode_prompt(chat, "hi there") == chat.apply_chat_template(user, add_generation_prompt=True,
                                                                       return_dict=True)["input_ids"]
    assert encode_prompt(base, "hi there") == base.encode("hi there") == render_prompt(base, user)
    with pytest.raises(DraftsmithError, match="no chat template"):
        encode_prompt(base, "hi there", chat=True)
