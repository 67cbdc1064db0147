"""Prompt rows and files for data-pipeline tests (a helper module: test modules import from here, never from
each other)."""
from __future__ import annotations

import json

import pytest

from draftsmith.data.config import DataBuildConfig
from draftsmith.serve.core.target_config import TargetConfig

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


@pytest.fixture()
def prompts(tmp_path):
    """PROMPTS as a JSONL file (import it as a fixture: `from tests.data_fixtures import prompts  # noqa: F401`)."""
    return write_jsonl(tmp_path / "prompts.jsonl", PROMPTS)


def config_for(prompts, **kw) -> DataBuildConfig:
    """A small, fast build of `prompts` on the CPU."""
    base = dict(prompts=[str(prompts)], max_new_tokens=6, batch_size=2, max_length=256,
                target=TargetConfig(device="cpu"))
    base.update(kw)
    return DataBuildConfig(**base)


def read(out):
    import datasets

    return datasets.load_from_disk(str(out)).to_dict()
