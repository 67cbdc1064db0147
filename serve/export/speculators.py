"""The speculators format (vllm-project/speculators), which `vllm serve DIR` reads directly.

config.json (speculators 0.9 `Eagle3SpeculatorConfig`; vLLM vllm/transformers_utils/configs/speculators/):
`speculators_model_type: eagle3`, `architectures: [Eagle3Speculator]`, `transformer_layer_config` (the draft
Llama layer), `draft_vocab_size`, `norm_before_residual` (vLLM's reader DEFAULTS IT TO TRUE, the package to
false: always written), `norm_before_fc`, `target_hidden_size`, top-level `eagle_aux_hidden_state_layer_ids`
(vLLM convention), and `speculators_config` {algorithm, proposal_methods [{proposal_type: greedy,
speculative_tokens}], default_proposal_method, verifier {name_or_path, architectures}}; vLLM takes
`num_speculative_tokens` from the first proposal method and, for `vllm serve DIR`, loads the verifier named there
(vLLM 0.33 `maybe_override_with_speculators` accepts only a hub id there, never a local folder, so the README
leads with `vllm serve TARGET --speculative-config '{"model": DIR, ...}'`, which works everywhere).
Tensors: `layers.0.*` (Eagle3DraftModel's name; vLLM prefixes `model.`), `fc.weight`, `norm.weight`,
`lm_head.weight`, and `d2t`/`t2d` only with a reduced vocabulary (the package registers them only then);
embed_tokens come from the verifier. Both speculators 0.9 and vLLM's reader know eagle3 only among EAGLE
variants, so EAGLE-1 and Medusa have no speculators form.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from draftsmith.serve.drafters.draft_layer import shared_embedding
from draftsmith.serve.drafters.head_config import HeadConfig
from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.export.common import ABSENT, Expect, ExportError, FormatSpec, TargetFacts
from draftsmith.serve.export.eagle import (check_eagle_exportable, eagle_tensors, expected_eagle_tensors,
                                           expected_llama_fields, feature_norm_fields, feature_norm_support,
                                           feature_norms, read_eagle3, rename_prefix)
from draftsmith.serve.export.engines import Support
from draftsmith.serve.export.layer_ids import aux_layer_ids_for
from draftsmith.serve.export.llama_config import llama_layer_config

NAME = "speculators"
ENGINE = "vLLM"  # the engine that serves the speculators format
METHODS = ("eagle3",)
SPECULATORS_VERSION = "0.9.0"  # the schema this writer follows


def support(config: HeadConfig) -> Support:
    return feature_norm_support(config, NAME, ENGINE) or Support(ENGINE)


def check_exportable(config: HeadConfig) -> None:
    if config.method not in METHODS:
        raise DraftsmithError(f"--format speculators cannot export method {config.method!r}: the speculators format "
                              f"(and vLLM's reader of it) has EAGLE-3 only; use --format vllm")
    check_eagle_exportable(config, NAME)


def build(state: dict[str, torch.Tensor], config: HeadConfig, facts: TargetFacts) -> tuple[dict, dict]:
    check_exportable(config)
    k = config.num_speculative_tokens
    body = {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": SPECULATORS_VERSION,
        "transformer_layer_config": llama_layer_config(config),
        "draft_vocab_size": config.draft_vocab_size,
        "target_hidden_size": config.hidden_size,
        "norm_before_residual": False,  # vLLM's speculators reader defaults it to TRUE: always written
        **feature_norms(config),
        "norm_output": False,
        "eagle_aux_hidden_state_layer_ids": aux_layer_ids_for(config, NAME, facts.num_layers),
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": k, "verifier_accept_k": 1,
                                  "accept_tolerance": 0.0}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": facts.verifier, "architectures": list(facts.architectures)},
        },
    }
    tensors = eagle_tensors(state, config, layer_prefix="layers.0")
    return body, tensors


def expected(config: HeadConfig, facts: TargetFacts) -> FormatSpec:
    text = facts.text
    ids = aux_layer_ids_for(config, NAME, facts.num_layers)
    fields = expected_llama_fields(text, prefix="transformer_layer_config.")
    fields.update({
        "architectures": Expect(["Eagle3Speculator"]),
        "speculators_model_type": Expect("eagle3", "vLLM picks its speculators reader by this key"),
        "draft_vocab_size": Expect(config.draft_vocab_size, "rows of the draft lm_head"),
        "target_hidden_size": Expect(int(text["hidden_size"]), "fc reads 3 x target_hidden_size"),
        "norm_before_residual": Expect(False, "vLLM's speculators reader defaults it to true"),
        **feature_norm_fields(config),
        "norm_output": Expect(False, "drafts feed back un-normed states", also=(ABSENT,)),
        "eagle_aux_hidden_state_layer_ids": Expect(ids, "vLLM convention: id i = input of layer i"),
        "speculators_config.algorithm": Expect("eagle3"),
        "speculators_config.proposal_methods.0.proposal_type": Expect("greedy"),
        "speculators_config.proposal_methods.0.speculative_tokens": Expect(config.num_speculative_tokens,
                                                                          "vLLM's num_speculative_tokens"),
        "speculators_config.default_proposal_method": Expect("greedy"),
        "speculators_config.verifier.architectures": Expect(list(facts.architectures), "the target's architectures"),
        "speculators_config.verifier.name_or_path": Expect(facts.verifier, "the target vLLM loads as verifier"),
    })
    tensors = expected_eagle_tensors(config, text, layer_prefix="layers.0", fc_bias=False)
    return FormatSpec(NAME, "eagle3", fields, tensors, engine_layer_ids=ids)


def check_extra(config: dict) -> list[str]:
    verifier = (((config.get("speculators_config") or {}).get("verifier")) or {}).get("name_or_path")
    return [] if verifier else ["config field 'speculators_config.verifier.name_or_path' is empty, expected the "
                                "target's name or path (vLLM serves DIR with that verifier)"]


def read(config: dict, tensors: dict, *, num_layers: int, where: str) -> tuple[HeadConfig, dict]:
    """The head vLLM's speculators reader builds (vllm/transformers_utils/configs/speculators/)."""
    kind = config.get("speculators_model_type")
    if kind != "eagle3":
        raise ExportError(f"{where}: speculators_model_type is {kind!r}; expected 'eagle3' (the only EAGLE type "
                          f"vLLM's speculators reader registers)")
    layer_source = config.get("transformer_layer_config")
    if not isinstance(layer_source, dict):
        raise ExportError(f"{where}: transformer_layer_config is missing; expected the draft layer's Llama config")
    tensors = rename_prefix(tensors, "layers.0.", "midlayer.")
    # algos.py update_eagle3: norm_before_residual defaults to True.
    return read_eagle3(config, tensors, where=where, engine=NAME, num_layers=num_layers,
                       ids_key="eagle_aux_hidden_state_layer_ids", layer_source=layer_source,
                       norm_before_residual_default=True)


def usage(config: HeadConfig, *, out: str, facts: TargetFacts) -> str:
    k = config.num_speculative_tokens
    spec = {"model": out, "method": "eagle3", "num_speculative_tokens": k}
    lines = [f"Name the target and point `--speculative-config` at this folder (every vLLM version, local or hub "
             f"target):", "", f"```bash\nvllm serve {facts.verifier} --speculative-config '{json.dumps(spec)}'\n```",
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


def notes(config: HeadConfig, facts: TargetFacts) -> list[str]:
    return []


# ------------------------------------------------------------------------- the speculators package's own loader

def package_available() -> bool:
    try:
        import speculators  # noqa: F401
    except ImportError:
        return False
    return True


def package_check(out: str | Path, target, readback_head, *, where: str) -> str:
    """With the `speculators` package installed, load the folder with its own config class and model and
    compare its weights and first draft step with the read-back head; raises ExportError on any disagreement."""
    if not package_available():
        return "speculators package not installed: validated against the schema in serve/export/speculators.py"
    return _check_with_package(out, target, readback_head, where=where)


def _check_with_package(out: str | Path, target, readback_head, *, where: str) -> str:
    from speculators import SpeculatorModelConfig
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig

    try:
        config = SpeculatorModelConfig.from_pretrained(str(out))
    except Exception as err:  # pydantic / transformers validation errors: report them as the package says
        raise ExportError(f"{where}: speculators.SpeculatorModelConfig rejects config.json: "
                          f"{str(err).splitlines()[0]}") from None
    if not isinstance(config, Eagle3SpeculatorConfig):
        raise ExportError(f"{where}: speculators loads a {type(config).__name__}, expected Eagle3SpeculatorConfig")
    config.transformer_layer_config._attn_implementation = "eager"  # noqa: SLF001 (CPU: no flex attention)
    model = Eagle3DraftModel.from_pretrained(str(out), config=config).eval()
    # speculators 0.9 pins transformers<=5.19. Under newer transformers the NaN sentinel its `_init_vocab` puts in
    # embed_tokens is lost (weights are materialized uninitialized), so its "load the verifier's embeddings when
    # still NaN" test can keep garbage; load them from the verifier explicitly, as the package intends.
    model._load_verifier_weights(overwrite_embed_tokens=True)  # noqa: SLF001
    ours = readback_head.state_dict()
    theirs = model.state_dict()
    shared = {"embed_tokens.weight", "verifier_lm_head.weight", "verifier_norm.weight", "d2t", "t2d"}
    for name, tensor in theirs.items():
        if name in shared:
            continue
        mine = ours.get(name.replace("layers.0.", "midlayer.", 1))
        if mine is None or tuple(mine.shape) != tuple(tensor.shape) or not torch.equal(mine.float(), tensor.float()):
            raise ExportError(f"{where}: speculators' Eagle3DraftModel holds {name!r} {list(tensor.shape)} that "
                              f"differs from the exported weights (expected loaded from model.safetensors)")
    embed = target.model.get_input_embeddings().weight.detach().float().cpu()
    if not torch.equal(model.embed_tokens.weight.float(), embed):
        bad = torch.nonzero((model.embed_tokens.weight.float() - embed).abs().sum(-1)).flatten().tolist()
        raise ExportError(f"{where}: speculators loaded embed_tokens that differ from the target's in rows {bad[:8]} "
                          f"(verifier {config.speculators_config.verifier.name_or_path})")
    _compare_first_step(model, readback_head, target, where=where)
    from importlib.metadata import version

    return (f"speculators {version('speculators')}: Eagle3SpeculatorConfig validated, "
            f"Eagle3DraftModel loaded every tensor, first-step logits match")


@torch.no_grad()
def _compare_first_step(model, head, target, *, where: str) -> None:
    """speculators' modules vs our read-back head on one teacher-forced pass over a short prompt."""
    from draftsmith.serve.drafters.masks import additive, causal_allowed

    from draftsmith.serve.core.target import text_config

    ids = torch.arange(3, 3 + 12) % int(text_config(target.config).vocab_size)
    out = target.model(ids[None], output_hidden_states=True)
    layers = list(model.config.eagle_aux_hidden_state_layer_ids)  # vLLM convention: input of layer i
    aux = torch.cat([out.hidden_states[i][0] for i in layers], dim=-1).float()  # (T, 3h)
    next_ids = torch.cat([ids[1:], ids[-1:]])
    fused = model.fc(aux)
    embeds = model.embed_tokens(next_ids)
    x = torch.cat([embeds, fused], dim=-1)[None]  # (1, T, 2h)
    positions = torch.arange(ids.numel())[None]
    mask = additive(causal_allowed(ids.numel(), 0), x.dtype)[None]  # (1, 1, T, T)
    hidden = model.layers[0](x, attention_mask=mask, position_ids=positions,
                             position_embeddings=model.rotary_emb(x, positions))
    theirs = model.lm_head(model.norm(hidden))[0]  # (T, Vd)

    hs = {i - 1: out.hidden_states[i][0].float() for i in layers}  # our convention: output of layer i - 1
    mine_fused = head.input_hidden(hs)
    embeds = shared_embedding(target)(next_ids).float()
    mine = head.logits(head(mine_fused[None], embeds[None], position_ids=positions, attention_mask=mask))[0]
    if not torch.allclose(mine, theirs, atol=1e-4, rtol=1e-4):
        raise ExportError(f"{where}: speculators' Eagle3DraftModel computes different first-step logits (max abs "
                          f"diff {float((mine - theirs).abs().max()):.3g}); expected the read-back head's")

