"""Assistant-only loss masks, read off the target's own template (markers or render diff), multi-turn."""
from __future__ import annotations

import pytest

from draftsmith.data.masks import has_generation_markers, render_prompt, render_with_mask
from draftsmith.serve.core.errors import DraftsmithError
from tests.tiny_models import CHAT_TEMPLATE, tiny_tokenizer

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi there"},
    {"role": "assistant", "content": "Hello! How can I help?"},
    {"role": "user", "content": "Add 2 and 3."},
    {"role": "assistant", "content": "2 + 3 = 5."},
]
# Renders the last assistant turn with an empty think block and earlier ones without (as Qwen3's does), so
# the conversation up to turn j is not a prefix of the whole: the diff must locate the turn instead.
UNSTABLE_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'assistant' %}{{ '<|im_start|>assistant\n' }}"
    "{% if loop.last %}{{ '<think>\n\n</think>\n\n' }}{% endif %}{{ m['content'] + '<|im_end|>\n' }}"
    "{% else %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def masked_text(tokenizer, ids, mask) -> str:
    return tokenizer.decode([i for i, m in zip(ids, mask) if m])


def test_markers_and_diff_agree_on_tiny_template_multi_turn():
    tok = tiny_tokenizer()
    assert has_generation_markers(tok)
    markers = render_with_mask(tok, CONVERSATION, method="markers")
    diff = render_with_mask(tok, CONVERSATION, method="diff")
    assert markers == diff
    ids, mask = diff
    assert masked_text(tok, ids, mask) == "Hello! How can I help?<|im_end|>2 + 3 = 5.<|im_end|>"
    assert tok.decode(ids) == tok.apply_chat_template(CONVERSATION, tokenize=False)
    # two runs of 1s, one per assistant turn; the newline the template writes after <|im_end|> is not in them
    runs = sum(1 for k in range(len(mask)) if mask[k] and (k == 0 or not mask[k - 1]))
    assert runs == 2 and mask[-1] == 0


def test_diff_without_markers_matches_marker_truth():
    plain_template = CHAT_TEMPLATE.replace("{% generation %}", "").replace("{% endgeneration %}", "")
    tok_markers, tok_plain = tiny_tokenizer(), tiny_tokenizer(plain_template)
    assert not has_generation_markers(tok_plain)
    assert render_with_mask(tok_plain, CONVERSATION) == render_with_mask(tok_markers, CONVERSATION)
    with pytest.raises(DraftsmithError, match="generation"):
        render_with_mask(tok_plain, CONVERSATION, method="markers")


def test_prompt_is_a_prefix_of_the_trained_row():
    tok = tiny_tokenizer()
    prompt = render_prompt(tok, CONVERSATION[:4])
    ids, mask = render_with_mask(tok, CONVERSATION)
    assert ids[: len(prompt)] == prompt
    assert masked_text(tok, ids[len(prompt):], mask[len(prompt):]) == "2 + 3 = 5.<|im_end|>"


def test_template_that_rewrites_earlier_turns():
    tok = tiny_tokenizer(UNSTABLE_TEMPLATE)
    ids, mask = render_with_mask(tok, CONVERSATION)
    assert masked_text(tok, ids, mask) == "Hello! How can I help?<|im_end|><think>\n\n</think>\n\n2 + 3 = 5.<|im_end|>"


def test_plain_prompt_completion_without_template():
    tok = tiny_tokenizer(chat_template=None)
    with pytest.raises(DraftsmithError, match="no chat template.*data.chat=false"):
        render_with_mask(tok, CONVERSATION[1:3])
    ids, mask = render_with_mask(tok, CONVERSATION[1:], chat=False)
    assert tok.decode(ids) == "Hi thereHello! How can I help?\n\nAdd 2 and 3.2 + 3 = 5.<|im_end|>"
    assert masked_text(tok, ids, mask) == "Hello! How can I help?2 + 3 = 5.<|im_end|>"
    prompt = render_prompt(tok, CONVERSATION[1:4], chat=False)
    assert ids[: len(prompt)] == prompt and not any(mask[: len(prompt)][-3:])


def test_bad_conversations():
    tok = tiny_tokenizer()
    with pytest.raises(DraftsmithError, match="start with an assistant"):
        render_with_mask(tok, [{"role": "assistant", "content": "x"}], method="diff")
    with pytest.raises(DraftsmithError, match="empty conversation"):
        render_with_mask(tok, [])
    with pytest.raises(DraftsmithError, match="unknown mask method"):
        render_with_mask(tok, CONVERSATION, method="separators")


@pytest.mark.slow
def test_default_target_template_multi_turn(demo_target_dir):
    """SmolLM2's template has no generation markers and injects a system prompt: diff must find the turns."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(demo_target_dir)
    assert not has_generation_markers(tok)
    convo = CONVERSATION[1:]  # no system turn: the template writes its own
    ids, mask = render_with_mask(tok, convo)
    assert masked_text(tok, ids, mask) == "Hello! How can I help?<|im_end|>2 + 3 = 5.<|im_end|>"
    n_content = sum(len(tok(m["content"], add_special_tokens=False)["input_ids"]) for m in convo
                    if m["role"] == "assistant")
    assert sum(mask) == n_content + 2  # each turn's tokens and its <|im_end|>, nothing else
    prompt = render_prompt(tok, convo[:3])
    assert ids[: len(prompt)] == prompt and "You are a helpful AI assistant" in tok.decode(prompt)
