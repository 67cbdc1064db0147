"""vLLM's own draft formats (`--format vllm`): each method's form lives in its folder (serve/methods/<name>/: EAGLE-1
`EagleLlamaForCausalLM`, EAGLE-3 `LlamaForCausalLMEagle3`, Medusa `MedusaModel`); here is what is vLLM's alone, the
command that serves a drafter."""
from __future__ import annotations

import json

from draftsmith.serve.export.common import TargetFacts

NAME = "vllm"
ENGINE = "vLLM"


def usage(serve_as: str, *, k: int, out: str, facts: TargetFacts, options: dict | None = None) -> str:
    """How to serve the folder `out` with vLLM; serve_as: the speculative_config's `method`; options: its other keys."""
    spec = {"model": out, "method": serve_as, "num_speculative_tokens": k, **(options or {})}
    return (f"```bash\nvllm serve {facts.verifier} --speculative-config '{json.dumps(spec)}'\n```\n\n"
            f"```python\nfrom vllm import LLM, SamplingParams\n\n"
            f"llm = LLM(model={facts.verifier!r}, speculative_config={spec!r})\n"
            f"print(llm.generate([\"Hello\"], SamplingParams(temperature=0, max_tokens=64))[0].outputs[0].text)\n```\n")
