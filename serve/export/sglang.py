"""SGLang's draft formats (`--format sglang`): each method's form lives in its folder (serve/methods/<name>/: EAGLE-1
`LlamaForCausalLMEagle`, EAGLE-3 `LlamaForCausalLMEagle3`; SGLang has no Medusa drafter); here is what is SGLang's
alone, the command that serves a drafter."""
from __future__ import annotations

from draftsmith.serve.export.common import TargetFacts

NAME = "sglang"
ENGINE = "SGLang"


def usage(serve_as: str, *, k: int, out: str, facts: TargetFacts, options: dict | None = None) -> str:
    """How to serve the folder `out` with SGLang; serve_as: its --speculative-algorithm; options: `num_steps`, the
    draft forwards a cycle (default k: one a token; a block drafter's 1)."""
    steps = (options or {}).get("num_steps", k)
    return (f"```bash\npython -m sglang.launch_server --model-path {facts.verifier} \\\n"
            f"    --speculative-algorithm {serve_as} --speculative-draft-model-path {out} \\\n"
            f"    --speculative-num-steps {steps} --speculative-eagle-topk 1 "
            f"--speculative-num-draft-tokens {k + 1}\n```\n\n"
            + (f"(One draft forward drafts the block of {k} tokens; SGLang runs block drafters with topk 1.)\n"
               if steps != k else
               f"(`--speculative-eagle-topk 1` drafts a chain of {k} tokens, what this drafter was validated with; "
               f"raise topk and num-draft-tokens for EAGLE-2 style trees.)\n"))
