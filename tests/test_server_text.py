"""Streamed text assembly: deltas concatenate to the whole text, stop strings are cut, never leaked."""
from __future__ import annotations

import pytest

from draftsmith.serve.server.text import TextAssembler, find_stop, held_back
from tests.tiny_models import tiny_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


def ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def stream(tokenizer, token_ids: list[int], stops=(), step: int = 1) -> tuple[list[str], TextAssembler]:
    assembler = TextAssembler(tokenizer, stops)
    deltas = [assembler.add(token_ids[i:i + step]) for i in range(0, len(token_ids), step)]
    deltas.append(assembler.finish())
    return deltas, assembler


def test_find_stop_and_hold_back():
    assert find_stop("abc STOP def END", ["END", "STOP"]) == 4
    assert find_stop("abc", ["x"]) == -1
    assert held_back("hello ST", ["STOP"]) == 2
    assert held_back("hello S", ["STOP", "Sx"]) == 1
    assert held_back("hello", ["STOP"]) == 0
    assert held_back("ab\ufffd\ufffd", []) == 2


@pytest.mark.parametrize("step", [1, 3])
def test_deltas_concatenate_to_whole_text(tokenizer, step):
    text = "héllo wörld, ünïcode → ✓ done"  # multi-byte characters span several byte tokens
    deltas, assembler = stream(tokenizer, ids(tokenizer, text), step=step)
    assert "".join(deltas) == text == assembler.text
    assert not any("\ufffd" in d for d in deltas)  # partial characters are held back, never sent


@pytest.mark.parametrize("step", [1, 2, 5])
def test_stop_string_is_cut_and_never_streamed(tokenizer, step):
    text = "one two STOP three STOP four"
    deltas, assembler = stream(tokenizer, ids(tokenizer, text), stops=["STOP", "zzz"], step=step)
    assert "".join(deltas) == "one two " == assembler.text
    assert assembler.stopped
    assert not any("S" in d for d in deltas)


def test_partial_stop_prefix_is_released_at_the_end(tokenizer):
    deltas, assembler = stream(tokenizer, ids(tokenizer, "abc ST"), stops=["STOP"])
    assert "".join(deltas[:-1]) == "abc " and deltas[-1] == "ST"
    assert not assembler.stopped


def test_special_tokens_are_not_in_the_text(tokenizer):
    deltas, assembler = stream(tokenizer, ids(tokenizer, "hi") + [tokenizer.convert_tokens_to_ids("<|im_end|>")])
    assert assembler.text == "hi"
