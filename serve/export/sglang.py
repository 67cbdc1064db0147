"""SGLang's draft formats (`--format sglang`): each method's form lives in its folder (serve/methods/<name>/: EAGLE-1
`LlamaForCausalLMEagle`, EAGLE-3 `LlamaForCausalLMEagle3`; SGLang has no Medusa drafter); here is what is SGLang's
alone, the command that serves a drafter."""
from __future__ import annotations

from draftsmith.serve.export.common import TargetFacts

NAME = "sglang"
ENGINE = "SGLang"


def usage(serve_as: str, *, k: int, out: str, facts: TargetFacts, options: dict | None = None) -> str:
    """How to serve the folder `out` with SGLang; serve_as: its --speculative-algorithm (options: none it takes)."""
    return (f"```bash\npython -m sglang.launch_server --model-path {facts.verifier} \\\n"
            f"    --speculative-algorithm {serve_as} --speculative-draft-model-path {out} \\\n"
            f"    --speculative-num-steps {k} --speculative-eagle-topk 1 "
            f"--speculative-num-draft-tokens {k + 1}\n```\n\n"
            f"(`--speculative-eagle-topk 1` drafts a chain of {k} tokens, what this drafter was validated with; "
            f"raise topk and num-draft-tokens for EAGLE-2 style trees.)\n")
