"""Token ids -> text for a response, streamed or whole, with stop strings cut off.

The streamed deltas concatenate to exactly the text a non-streamed response returns: text is held
back while it could still be the start of a stop string, or while its last character is an
incomplete UTF-8 sequence (the tokenizer decodes those to U+FFFD).
"""
from __future__ import annotations

from typing import Any, Sequence

REPLACEMENT_CHAR = "\ufffd"


def find_stop(text: str, stop_strings: Sequence[str]) -> int:
    """Index of the earliest stop string in `text`, or -1."""
    hits = [i for i in (text.find(s) for s in stop_strings) if i >= 0]
    return min(hits) if hits else -1


def held_back(text: str, stop_strings: Sequence[str]) -> int:
    """How many trailing characters of `text` must wait: a possible stop-string start or a partial character."""
    hold = 0
    for stop in stop_strings:
        for n in range(min(len(stop) - 1, len(text)), 0, -1):
            if text.endswith(stop[:n]):
                hold = max(hold, n)
                break
    if text.endswith(REPLACEMENT_CHAR):
        hold = max(hold, len(text) - len(text.rstrip(REPLACEMENT_CHAR)))
    return hold


class TextAssembler:
    """Collects generated token ids; `add` returns the text that is safe to send now, `finish` the rest."""

    def __init__(self, tokenizer: Any, stop_strings: Sequence[str] = ()):
        self.tokenizer = tokenizer
        self.stop_strings = tuple(stop_strings)
        self.token_ids: list[int] = []
        self.sent = ""  # text already handed out
        self.stopped = False  # a stop string was seen: nothing after it is ever sent

    def _decode(self) -> str:
        # Whole-sequence decoding keeps tokenizers' context-dependent rules (leading spaces, byte
        # fallback) identical to the non-streamed text; outputs are at most a few thousand tokens.
        return self.tokenizer.decode(self.token_ids, skip_special_tokens=True)

    def _advance(self, text: str, *, final: bool) -> str:
        if self.stopped:
            return ""
        cut = find_stop(text, self.stop_strings)
        if cut >= 0:
            self.stopped = True
            ready = text[:cut]
        elif final:
            ready = text
        else:
            ready = text[: len(text) - held_back(text, self.stop_strings)]
        if not ready.startswith(self.sent) or len(ready) <= len(self.sent):
            return ""
        delta = ready[len(self.sent):]
        self.sent = ready
        return delta

    def add(self, token_ids: Sequence[int]) -> str:
        self.token_ids.extend(int(t) for t in token_ids)
        return self._advance(self._decode(), final=False)

    def finish(self) -> str:
        return self._advance(self._decode(), final=True)

    @property
    def text(self) -> str:
        """Everything sent so far (after `finish`: the whole response text)."""
        return self.sent
