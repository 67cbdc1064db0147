"""The project's own prompt sets, one JSONL per domain, written for the demo on a fresh machine.

They are meant to be as broad as users' traffic, since a drafter learns the style of its training prompts:
tasks (code, math, extraction, summarization, translation between English and French/German/Spanish/
Italian/Portuguese, question answering, answers grounded in short `Context:` passages (`rag`), structured
output), conversation (`chat`, `multiturn`: 2-3 user turns that build on each other, `roleplay`: a persona
set by a system prompt) and `creative` writing. `edit` is repetition-heavy on purpose (rewrite this code
with a small change): the traffic where a drafter, and prompt lookup, accept long runs.

Rows are only ever appended to a domain, never edited, so a dataset built from an older set keeps its rows
(data/build.py reuses a row with the same id and turns). The demo holds out the last rows of each domain for
evaluation (scripts/demo/run.py, split_builtin), so they are kept typical of their domain.
"""
from __future__ import annotations

from pathlib import Path

from draftsmith.serve.core.errors import DraftsmithError

BUILTIN_DIR = Path(__file__).with_name("builtin")
BUILTIN_DOMAINS = ("code", "math", "chat", "extraction", "creative", "summarization", "edit",
                   "translation", "qa", "rag", "multiturn", "structured", "roleplay")


def builtin_files(domain: str | None = None) -> list[Path]:
    """The JSONL file of `domain`, or of every domain (in BUILTIN_DOMAINS order) when None."""
    if domain is not None and domain not in BUILTIN_DOMAINS:
        raise DraftsmithError(f"no built-in prompt set {domain!r}; choose one of {', '.join(BUILTIN_DOMAINS)} "
                              f"(or `builtin` for all)")
    files = [BUILTIN_DIR / f"{d}.jsonl" for d in ((domain,) if domain else BUILTIN_DOMAINS)]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise DraftsmithError(f"built-in prompt files missing from the installation: {', '.join(missing)}")
    return files
