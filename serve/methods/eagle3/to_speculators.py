"""EAGLE-3 in the speculators format (vllm-project/speculators `Eagle3Speculator`), which `vllm serve DIR` reads.

config.json (speculators 0.9 `Eagle3SpeculatorConfig`; vLLM vllm/transformers_utils/configs/speculators/):
`speculators_model_type: eagle3`, `architectures: [Eagle3Speculator]`, `transformer_layer_config` (the draft
Llama layer), `draft_vocab_size`, `norm_before_residual` (vLLM's reader DEFAULTS IT TO TRUE, the package to
false: always written), `norm_before_fc`, `target_hidden_size`, top-level `eagle_aux_hidden_state_layer_ids`
(vLLM convention), and `speculators_config` {algorithm, proposal_methods [{proposal_type: greedy,
speculative_tokens}], default_proposal_method, verifier {name_or_path, architectures}}; vLLM takes
`num_speculative_tokens` from the first proposal method. Tensors: `layers.0.*` (Eagle3DraftModel's name; vLLM
prefixes `model.`), `fc.weight`, `norm.weight`, `lm_head.weight`, and `d2t`/`t2d` only with a reduced vocabulary
(the package registers them only then); embed_tokens come from the verifier.
"""
from __future__ import annotations

from pathlib import Path

import torch

from draftsmith.serve.drafters.draft_layer import shared_embedding
from draftsmith.serve.drafters.head_config import HeadConfig
from draftsmith.serve.export.common import Expect, ExportError, FormatSpec, TargetFacts
from draftsmith.serve.export.eagle import expected_llama_fields, rename_prefix
from draftsmith.serve.export.engines import Support
from draftsmith.serve.export.layer_ids import aux_layer_ids_for
from draftsmith.serve.export.llama_config import llama_layer_config
from draftsmith.serve.export.method_export import FormatExport
from draftsmith.serve.export import speculators as speculators_format
from draftsmith.serve.methods.eagle3.export import (check, engine_tensors, expected_tensors, feature_norm_fields,
                                                    feature_norm_support, feature_norms, read_eagle3)
from draftsmith.serve.core.target import Target

NAME = "speculators"
ARCHITECTURES = ("Eagle3Speculator",)
MODEL_TYPE = "eagle3"  # speculators_model_type: vLLM picks its speculators reader by it
SPECULATORS_VERSION = "0.9.0"  # the schema this writer follows


def build(state: dict[str, torch.Tensor], config: HeadConfig, facts: TargetFacts) -> tuple[dict, dict]:
    k = config.num_speculative_tokens
    body = {
        "architectures": list(ARCHITECTURES),
        "speculators_model_type": MODEL_TYPE,
        "speculators_version": SPECULATORS_VERSION,
        "transformer_layer_config": llama_layer_config(config),
        "draft_vocab_size": config.draft_vocab_size,
        "target_hidden_size": config.hidden_size,
        "norm_before_residual": False,  # vLLM's speculators reader defaults it to TRUE: always written
        **feature_norms(config),
        "eagle_aux_hidden_state_layer_ids": aux_layer_ids_for(config, NAME, facts.num_layers),
        "speculators_config": speculators_format.speculators_config(MODEL_TYPE, k, facts),
    }
    return body, engine_tensors(state, config, layer_prefix="layers.0")


def expected(config: HeadConfig, facts: TargetFacts) -> FormatSpec:
    text = facts.text
    ids = aux_layer_ids_for(config, NAME, facts.num_layers)
    fields = expected_llama_fields(text, prefix="transformer_layer_config.")
    fields.update({
        "architectures": Expect(list(ARCHITECTURES)),
        "speculators_model_type": Expect(MODEL_TYPE, "vLLM picks its speculators reader by this key"),
        "draft_vocab_size": Expect(config.draft_vocab_size, "rows of the draft lm_head"),
        "target_hidden_size": Expect(int(text["hidden_size"]), "fc reads 3 x target_hidden_size"),
        "norm_before_residual": Expect(False, "vLLM's speculators reader defaults it to true"),
        **feature_norm_fields(config),
        "eagle_aux_hidden_state_layer_ids": Expect(ids, "vLLM convention: id i = input of layer i"),
        **speculators_format.speculators_config_fields(MODEL_TYPE, config.num_speculative_tokens, facts),
    })
    return FormatSpec(NAME, config.method, fields, expected_tensors(config, text, layer_prefix="layers.0"),
                      engine_layer_ids=ids)


def check_extra(config: dict) -> list[str]:
    verifier = (((config.get("speculators_config") or {}).get("verifier")) or {}).get("name_or_path")
    return [] if verifier else ["config field 'speculators_config.verifier.name_or_path' is empty, expected the "
                                "target's name or path (vLLM serves DIR with that verifier)"]


def claims(config: dict) -> bool:
    """vLLM's speculators reader registers eagle3 alone among EAGLE variants."""
    return config.get("speculators_model_type") == MODEL_TYPE


def read(config: dict, tensors: dict, *, num_layers: int, where: str) -> tuple[HeadConfig, dict]:
    """The head vLLM's speculators reader builds (vllm/transformers_utils/configs/speculators/)."""
    layer_source = speculators_format.layer_config(config, where=where, family="Llama")
    tensors = rename_prefix(tensors, "layers.0.", "midlayer.")
    # algos.py update_eagle3: norm_before_residual defaults to True.
    return read_eagle3(config, tensors, where=where, engine=NAME, num_layers=num_layers,
                       ids_key="eagle_aux_hidden_state_layer_ids", layer_source=layer_source,
                       norm_before_residual_default=True)


# ------------------------------------------------------------------------- the speculators package's own loader

def package_check(out: str | Path, target: Target, readback_head, *, where: str) -> str:
    """With the `speculators` package installed, load the folder with its own config class and model and
    compare its weights and first draft step with the read-back head; raises ExportError on any disagreement."""
    if not speculators_format.package_available():
        return ("speculators package not installed: validated against the schema in "
                "serve/methods/eagle3/to_speculators.py")
    return _check_with_package(out, target, readback_head, where=where)


def _check_with_package(out: str | Path, target: Target, readback_head, *, where: str) -> str:
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
def _compare_first_step(model, head, target: Target, *, where: str) -> None:
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


FORM = FormatExport(architectures=ARCHITECTURES, serve_as=MODEL_TYPE, check=lambda config: check(config, NAME),
                    support=lambda config: feature_norm_support(config, NAME, "vLLM") or Support("vLLM"),
                    build=build, expected=expected, claims=claims, read=read, hosted_as="EAGLE-3",
                    check_extra=check_extra, package_check=package_check)
