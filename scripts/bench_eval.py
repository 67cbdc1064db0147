"""The evaluation behind the closing numbers: HumanEval as code, GSM8K as math and the built-in domain sets,
on the default target, n-gram and the oracle (plus any --drafter passed) against plain decoding and transformers'
prompt lookup, in one interleaved run.

    python scripts/bench_eval.py --report runs/bench-eval [--drafter mine=runs/eagle3/drafter] [eval options]

Every option of `draftsmith eval` is accepted and overrides the preset; the public prompt sets are read from
../shared/data/eval (or $DRAFTSMITH_EVAL_DATA).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("DRAFTSMITH_EVAL_DATA", ROOT.parent / "shared" / "data" / "eval"))
BUILTIN_DOMAINS = ("chat", "creative", "edit", "summarization")


def preset(argv: list[str]) -> list[str]:
    out = ["eval"]
    if "--prompts" not in argv:
        for domain, name in (("code", "humaneval.jsonl"), ("math", "gsm8k_test.jsonl")):
            if not (DATA / name).is_file():
                sys.exit(f"bench_eval: {DATA / name} not found (set DRAFTSMITH_EVAL_DATA)")
            out += ["--prompts", f"{domain}={DATA / name}"]
        for domain in BUILTIN_DOMAINS:
            out += ["--prompts", f"builtin:{domain}"]
    out += ["--drafter", "ngram", "--drafter", "oracle"]  # drafters passed on the command line come after
    defaults = {"--limit": "4", "--max-new-tokens": "64", "--k": "5"}
    for flag, value in defaults.items():
        if flag not in argv:
            out += [flag, value]
    # transformers' plain generate is left out to save time; pass hf_plain=true to add it
    return out + argv + ([] if any(a.startswith("hf_plain=") for a in argv) else ["hf_plain=false"])


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    from scripts.cli import main

    sys.exit(main(preset(sys.argv[1:])))
