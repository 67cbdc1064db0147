"""The evaluation behind the closing numbers: HumanEval as code, GSM8K as math and the built-in domain sets,
on the default target, n-gram and the oracle (plus any --drafter passed) against plain decoding and transformers'
prompt lookup, in one interleaved run.

    python scripts/bench/eval.py --report runs/bench-eval [--drafter mine=runs/eagle3/drafter] [eval options]
    python scripts/bench/eval.py --heldout-after 150 --drafter e3=DIR --drafter e3-tree=DIR@tree ...

--heldout-after N replaces the built-in domains by the shared training file's roleplay and general prompts
that a `data build` with per_domain_limit=N did not train on (rows N, N+1, ... of each domain), so every
domain (code, math, roleplay, general) is held out from training.

Every option of `draftsmith eval` is accepted and overrides the preset; the public prompt sets are read from
../shared/data/eval (or $DRAFTSMITH_EVAL_DATA).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(os.environ.get("DRAFTSMITH_EVAL_DATA", ROOT.parent / "shared" / "data" / "eval"))
BUILTIN_DOMAINS = ("chat", "creative", "edit", "summarization")
TRAIN_PROMPTS = DATA.parent / "train" / "prompts.jsonl"
HELDOUT_DOMAINS = ("roleplay", "general")


def heldout_files(after: int, out_dir: Path) -> list[Path]:
    """One JSONL per HELDOUT_DOMAINS: that domain's rows of the shared training file after the first `after`."""
    import json

    rows = [json.loads(line) for line in TRAIN_PROMPTS.read_text().split("\n") if line.strip()]  # not splitlines: rows hold U+2028
    out_dir.mkdir(parents=True, exist_ok=True)
    files = []
    for domain in HELDOUT_DOMAINS:
        held = [r for r in rows if r.get("domain") == domain][after:]
        if not held:
            sys.exit(f"bench_eval: {TRAIN_PROMPTS} has no {domain} rows after the first {after}")
        path = out_dir / f"heldout-{domain}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in held))
        files.append(path)
    return files


def preset(argv: list[str]) -> list[str]:
    out = ["eval"]
    after = None
    if "--heldout-after" in argv:
        i = argv.index("--heldout-after")
        after = int(argv[i + 1])
        argv = argv[:i] + argv[i + 2:]
    if "--prompts" not in argv:
        for domain, name in (("code", "humaneval.jsonl"), ("math", "gsm8k_test.jsonl")):
            if not (DATA / name).is_file():
                sys.exit(f"bench_eval: {DATA / name} not found (set DRAFTSMITH_EVAL_DATA)")
            out += ["--prompts", f"{domain}={DATA / name}"]
        if after is not None:
            report = argv[argv.index("--report") + 1] if "--report" in argv else "runs/bench-eval"
            out += [arg for path in heldout_files(after, Path(report)) for arg in ("--prompts", str(path))]
        else:
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
    from draftsmith.cli import main

    sys.exit(main(preset(sys.argv[1:])))
