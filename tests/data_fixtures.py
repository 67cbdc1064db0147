"""Prompt rows and files for data-pipeline tests (a helper module: test modules import from here, never from
each other)."""
from __future__ import annotations

import json

PROMPTS = [
    {"id": "a", "domain": "math", "prompt": "1+1?"},
    {"id": "b", "domain": "code", "prompt": "Write a loop."},
    {"id": "c", "domain": "math", "question": "2*3?"},
    {"id": "d", "domain": "chat", "turns": ["Hi", "More?"]},
    {"id": "e", "domain": "chat", "messages": [{"role": "user", "content": "x"},
                                               {"role": "assistant", "content": "given answer"},
                                               {"role": "user", "content": "y"}]},
]


def quiet(_msg: str) -> None:
    pass


def write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path
