"""The speculators format (vllm-project/speculators, `--format speculators`), which `vllm serve DIR` reads directly;
each method's form lives in its folder (serve/methods/eagle3/to_speculators.py: speculators 0.9 and vLLM's reader
of it know EAGLE-3 alone among EAGLE variants, so EAGLE-1 and Medusa have no speculators form). Here is what is the
format's alone: the command that serves a drafter, and whether the speculators package runs beside draftsmith.

vLLM takes `num_speculative_tokens` from the first proposal method and, for `vllm serve DIR`, loads the verifier
named in `speculators_config` (vLLM 0.33 `maybe_override_with_speculators` accepts only a hub id there, never a local
folder, so the README leads with `vllm serve TARGET --speculative-config '{"model": DIR, ...}'`, which works
everywhere).
"""
from __future__ import annotations

import json

from draftsmith.serve.export.common import Expect, ExportError, TargetFacts

NAME = "speculators"
ENGINE = "vLLM"  # the engine that serves the speculators format


def speculators_config(algorithm: str, k: int, facts: TargetFacts) -> dict:
    """config.json's `speculators_config`: one greedy proposal method of k tokens (vLLM's num_speculative_tokens) and
    the verifier vLLM loads for `vllm serve DIR`."""
    return {"algorithm": algorithm,
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": k, "verifier_accept_k": 1,
                                  "accept_tolerance": 0.0}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": facts.verifier, "architectures": list(facts.architectures)}}


def layer_config(config: dict, *, where: str, family: str) -> dict:
    """The folder's `transformer_layer_config` (the draft layers' `family` config); ExportError when missing."""
    layer = config.get("transformer_layer_config")
    if not isinstance(layer, dict):
        raise ExportError(f"{where}: transformer_layer_config is missing; expected the draft layers' {family} config")
    return layer


def speculators_config_fields(algorithm: str, k: int, facts: TargetFacts) -> dict[str, Expect]:
    """What the validator expects of `speculators_config` (speculators_config above, as vLLM reads it)."""
    return {
        "speculators_config.algorithm": Expect(algorithm),
        "speculators_config.proposal_methods.0.proposal_type": Expect("greedy"),
        "speculators_config.proposal_methods.0.speculative_tokens": Expect(k, "vLLM's num_speculative_tokens"),
        "speculators_config.default_proposal_method": Expect("greedy"),
        "speculators_config.verifier.architectures": Expect(list(facts.architectures), "the target's architectures"),
        "speculators_config.verifier.name_or_path": Expect(facts.verifier, "the target vLLM loads as verifier"),
    }


def usage(serve_as: str, *, k: int, out: str, facts: TargetFacts, options: dict | None = None) -> str:
    """How to serve the folder `out` with vLLM; serve_as: the speculative_config's `method`; options: its other keys."""
    spec = {"model": out, "method": serve_as, "num_speculative_tokens": k, **(options or {})}
    lines = ["Name the target and point `--speculative-config` at this folder (every vLLM version, local or hub "
             "target):", "", f"```bash\nvllm serve {facts.verifier} --speculative-config '{json.dumps(spec)}'\n```",
             "", f"```python\nfrom vllm import LLM\n\nllm = LLM(model={facts.verifier!r}, "
                 f"speculative_config={spec!r})\n```", ""]
    if facts.verifier_is_local:
        lines += ["`vllm serve OUT` alone reads the target from `speculators_config.verifier.name_or_path`, here a "
                  "local folder: vLLM 0.33 refuses that (\"Speculators verifier must name a remote model "
                  "repository\"; vLLM 0.32 accepts it). To serve the folder alone on vLLM >= 0.33, export with "
                  "`--verifier ORG/NAME`, the hub id of this same target (same weights and tokenizer), then "
                  f"`vllm serve {out}`."]
    else:
        lines += [f"The verifier is named inside config.json (`speculators_config.verifier.name_or_path` = "
                  f"`{facts.verifier}`), so vLLM also serves the folder alone:", "",
                  f"```bash\nvllm serve {out}\n```"]
    return "\n".join(lines) + "\n"


def package_available() -> bool:
    try:
        import speculators  # noqa: F401
    except ImportError:
        return False
    return True
