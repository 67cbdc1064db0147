"""Range checks of typed configs, declared beside the fields they check and run when the config is built.

Each config dataclass names the range of its numeric settings in a `RANGES` class variable:

    RANGES: ClassVar[dict[str, str]] = {"lr": "> 0", "beta1": "[0, 1)", "max_steps": ">= 0", "k": ">= 1"}

`check_ranges(config)` walks the config and its sections: every float must be finite (NaN and inf are never a
setting), and each named field must lie in its range (an unset Optional passes; a list is checked item by item).
serve.core.config.load_config runs it on every config it builds; the validate() of a config built in code runs it too.
"""
from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Any

from draftsmith.serve.core.errors import ConfigError

__all__ = ["Range", "check_ranges", "parse_range"]

_BOUND = re.compile(r"^(>=|>|<=|<)\s*(\S+)$")
_INTERVAL = re.compile(r"^([\[(])\s*([^,\s]+)\s*,\s*([^,\s\])]+)\s*([\])])$")


@dataclass(frozen=True)
class Range:
    low: float | None = None
    high: float | None = None
    low_open: bool = False  # low itself is excluded
    high_open: bool = False

    def __contains__(self, value: float) -> bool:
        if self.low is not None and not (value > self.low if self.low_open else value >= self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def describe(self) -> str:
        if self.high is None:
            return f"above {_num(self.low)}" if self.low_open else f"at least {_num(self.low)}"
        if self.low is None:
            return f"below {_num(self.high)}" if self.high_open else f"at most {_num(self.high)}"
        return f"in {'(' if self.low_open else '['}{_num(self.low)}, {_num(self.high)}{')' if self.high_open else ']'}"


def _num(value: float | None) -> str:
    return f"{value:g}"


def parse_range(text: str) -> Range:
    """`> 0`, `>= 1`, `< 2`, `<= 1`, `[0, 1]`, `(0, 1]`, ... -> Range."""
    text = text.strip()
    if match := _BOUND.match(text):
        op, value = match.group(1), float(match.group(2))
        return Range(low=value, low_open=op == ">") if op.startswith(">") else Range(high=value, high_open=op == "<")
    if match := _INTERVAL.match(text):
        return Range(low=float(match.group(2)), high=float(match.group(3)), low_open=match.group(1) == "(",
                     high_open=match.group(4) == ")")
    raise ValueError(f"not a range: {text!r}")


def check_ranges(config: Any, *, prefix: str = "") -> None:
    """ConfigError naming the first setting (as `prefix` + its dotted key) that is not finite or out of range."""
    ranges = {name: parse_range(rule) for name, rule in getattr(type(config), "RANGES", {}).items()}
    for field in dataclasses.fields(config):
        value, key = getattr(config, field.name), f"{prefix}{field.name}"
        if dataclasses.is_dataclass(value):
            check_ranges(value, prefix=f"{key}.")
            continue
        items = value if isinstance(value, (list, tuple)) else [value]
        for item in items:
            if isinstance(item, float) and not math.isfinite(item):
                raise ConfigError(f"{key} must be a finite number, got {item}")
            allowed = ranges.get(field.name)
            if allowed is not None and isinstance(item, (int, float)) and not isinstance(item, bool) \
                    and item not in allowed:
                raise ConfigError(f"{key} must be {allowed.describe()}, got {item}")
