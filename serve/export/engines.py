"""Engine versions: which releases of an engine load what, and the refusal when the named one cannot.

The ranges come from the engines' released sources (every vLLM release 0.15-0.33 and SGLang 0.5.10-0.5.23
read), and the ones `scripts/check_engines.py` runs are marked as run there. A range is (first, last) with
None for "no bound known"; `refuse_unless_supported` raises before anything is written.
"""
from __future__ import annotations

from dataclasses import dataclass

from draftsmith.serve.core.errors import DraftsmithError

Version = tuple[int, ...]


def parse_version(text: str) -> Version:
    """'0.33', '0.33.0', 'v0.5.23', '0.32.0rc1' -> (0, 33), (0, 33, 0), (0, 5, 23), (0, 32, 0)."""
    parts = []
    for piece in text.strip().lstrip("v").split("."):
        digits = "".join(c for c in piece if c.isdigit()) if piece[:1].isdigit() else ""
        if not digits:
            raise DraftsmithError(f"engine version {text!r} is not a release number like 0.33.0")
        parts.append(int(digits))
        if digits != piece:
            break  # a pre-release suffix ends the number
    return tuple(parts)


def _show(version: Version | None) -> str:
    return ".".join(map(str, version)) if version else ""


@dataclass(frozen=True)
class Support:
    """Releases of `engine` that load one export: first..last (None = open), and the fix when outside."""
    engine: str
    first: Version | None = None
    last: Version | None = None
    why: str = ""   # what the engine lacks outside the range
    fix: str = ""

    def covers(self, version: Version) -> bool:
        n = len(version)
        return ((self.first is None or version >= self.first[:n])
                and (self.last is None or version <= self.last[:n]))

    def range_text(self) -> str:
        if self.first and self.last:
            return f"{self.engine} {_show(self.first)}–{_show(self.last)}"
        if self.first:
            return f"{self.engine} >= {_show(self.first)}"
        if self.last:
            return f"{self.engine} <= {_show(self.last)}"
        return f"every {self.engine} release draftsmith knows"


def refuse_unless_supported(support: Support, version: str | None, *, what: str) -> None:
    """Raise when `version` (the user's --engine-version, None = not named) falls outside `support`."""
    if not version:
        return
    if not support.covers(parse_version(version)):
        raise DraftsmithError(f"{what} does not load in {support.engine} {version}: {support.why}; it loads in "
                              f"{support.range_text()}. {support.fix}".rstrip())
