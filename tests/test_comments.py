"""Comments and docstrings say what the code does and why, in the present tense: none narrates a run ("the fourth
wall run", "was tried", "not kept"). The history of measured runs lives in docs/results.md and git."""
from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("serve", "data", "train", "eval", "scripts/cli")
NARRATION = re.compile(r"\b(first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|\d+(st|nd|rd|th))"
                       r" (held-out|wall) runs?\b|\bwall run\b|\bwas tried\b|\bwere tried\b|\bnot kept\b|"
                       r"\bREADME(:|'s table| table)|\bthis session\b|\blast session\b", re.I)


def prose(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring of a Python file."""
    source = path.read_text()
    found = [(tok.start[0], tok.string) for tok in tokenize.generate_tokens(io.StringIO(source).readline)
             if tok.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                found.append((getattr(node, "lineno", 1), doc))
    return found


def test_no_comment_or_docstring_narrates_a_run():
    hits = [f"{path.relative_to(ROOT)}:{line}: {NARRATION.search(text).group(0)!r}"
            for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))
            for line, text in prose(path) if NARRATION.search(text)]
    assert hits == []


def test_the_pattern_finds_narration():
    assert NARRATION.search("as in the fourth wall run of the table")
    assert NARRATION.search("a rule that was tried and not kept")
    assert not NARRATION.search("runs every prompt twice; the faster run counts; a prompt's first run pays")
