"""When generation stops: EOS tokens and stop strings, applied identically by plain and speculative decoding."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class StopChecker:
    """Finds the first position where generation must stop, like transformers' `generate`:
    the EOS token is kept; a stop string ends generation at the token that completes it."""
    eos_token_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()
    tokenizer: object | None = None

    def first_stop(self, tokens: list[int], start: int) -> int | None:
        """Index (exclusive end) of the output to keep if a stop occurs at or after `start`, else None."""
        for i in range(start, len(tokens)):
            if tokens[i] in self.eos_token_ids:
                return i + 1
            if self.stop_strings and self.tokenizer is not None:
                text = self.tokenizer.decode(tokens[: i + 1], skip_special_tokens=False)
                window = text[-(max(map(len, self.stop_strings)) + 32):]
                if any(s in window for s in self.stop_strings):
                    return i + 1
        return None
