"""A newcomer's path: the README's quick starts run as written, on a tiny target standing in for `$T`.

Every `draftsmith` command of the quick-start blocks runs, in order, through bash with `T` set, from a folder that
holds the prompt files they name and the repository's configs/. What cannot run here is named and skipped: the
engines' own servers (vllm, sglang), GPU launchers, `draftsmith serve` (it blocks; tests/test_server_api.py serves),
and shell helpers (cat, curl, source)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SKIPPED = ("vllm ", "python -m sglang", "curl ", "cat ", "source ", "accelerate ", "torchrun ", "scripts/launch",
           "STRATEGY=", "draftsmith serve ")


def quick_start_commands(readme: str) -> list[str]:
    """The commands of the README's `## Quick start` sections: bash blocks, continuation lines joined, comments
    and variable assignments dropped."""
    commands = []
    for section in re.split(r"^## ", readme, flags=re.M):
        if not section.startswith("Quick start"):
            continue
        for block in re.findall(r"```bash\n(.*?)```", section, flags=re.S):
            text = re.sub(r"\\\n\s*", "", block)
            for line in text.splitlines():
                line = line.split(" #")[0].strip() if not line.lstrip().startswith("#") else ""
                if line and not re.match(r"^[A-Z]+=\S+$", line):
                    commands.append(line)
    return commands


def test_the_readme_names_its_quick_starts():
    commands = quick_start_commands((ROOT / "README.md").read_text())
    ran = [c for c in commands if not c.startswith(SKIPPED)]
    verbs = {c.split()[1] for c in ran if c.startswith("draftsmith ")}
    assert {"data", "train", "eval", "export", "generate"} <= verbs, ran


@pytest.mark.slow
def test_the_quick_starts_run_as_written_on_a_tiny_target(tmp_path):
    from tests.tiny_models import save_tiny_target

    # 4 layers for EAGLE-3's three aux layers; a vocabulary above the recipe's 8192-token draft vocabulary
    target = save_tiny_target(tmp_path / "target", "llama", num_hidden_layers=4, vocab_size=8300)
    rows = [{"prompt": f"Say {i} in words, then count to {i % 7 + 3}.", "domain": ("math", "chat")[i % 2]}
            for i in range(42)]  # the recipe holds 32 rows out for its evaluation
    (tmp_path / "my_traffic.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:40]))
    (tmp_path / "my_eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[40:]))  # held out
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "T": str(target), "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "WANDB_MODE": "offline", "PYTHONPATH": str(ROOT)}
    ran = []
    for command in quick_start_commands((ROOT / "README.md").read_text()):
        if command.startswith(SKIPPED):
            continue
        proc = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=600)
        assert proc.returncode == 0, f"{command}\n{proc.stderr[-2000:]}"
        ran.append(command.split()[1])
    assert ran.count("export") == 2 and "generate" in ran
    assert (tmp_path / "runs" / "mine" / "report" / "report.md").is_file()
    assert (tmp_path / "runs" / "mine" / "eagle3-sglang" / "model.safetensors").is_file()
