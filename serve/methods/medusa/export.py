"""Medusa's engine form: vLLM's own Medusa format (MedusaConfig, `MedusaModel`), vLLM 0.15-0.32; vLLM 0.33 removed
medusa.py and the "medusa" method. SGLang and the speculators format have no Medusa drafter.

What vLLM reads (vllm/model_executor/models/medusa.py, vllm/transformers_utils/configs/medusa.py): `num_heads`,
`num_hidden_layers` (ResBlocks per head), `medusa_fc_bias` (default false: biases would be dropped silently),
`original_lm_head` (false: one lm_head per head). Each head's lm_head is built with `vocab_size` rows whatever
`truncated_vocab_size` says, so a reduced-vocabulary head (Vd, h) fails the loader's shape check: only
full-vocabulary Medusa heads load. Every top-level key holding "num" and "heads"/"layers" is renamed to
num_heads/num_hidden_layers by MedusaConfig.from_pretrained.
"""
from __future__ import annotations

import torch

from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.core.layers import FINAL
from draftsmith.serve.drafters.head_config import HeadConfig
from draftsmith.serve.export.common import ABSENT, Expect, ExportError, FormatSpec, TargetFacts, get_field
from draftsmith.serve.export.engines import Support
from draftsmith.serve.export.eagle import read_vocab_maps
from draftsmith.serve.export.method_export import FormatExport

ARCHITECTURES = ("MedusaModel",)
MODEL_TYPE = "medusa"
FULL_VOCAB = ("vLLM's Medusa needs a full-vocabulary drafter (it builds every head's lm_head with the target's "
              "{vocab} rows; this drafter's heads have {draft} and fail its shape check): retrain with "
              "model.draft_vocab_size=0, or export an EAGLE drafter")


def support(config: HeadConfig) -> Support:
    """The vLLM releases that load it (checked: every release's source 0.15-0.33)."""
    return Support("vLLM", (0, 15), (0, 32), why="vLLM 0.33 removed Medusa (no medusa.py, no 'medusa' method)",
                   fix="Serve it with vLLM 0.32, or train and export an EAGLE-3 drafter for newer vLLM.")


def check(config: HeadConfig) -> None:
    if config.uses_draft_vocab:
        raise DraftsmithError(FULL_VOCAB.format(vocab=config.vocab_size, draft=config.draft_vocab_size))


def build(state: dict[str, torch.Tensor], config: HeadConfig, facts: TargetFacts) -> tuple[dict, dict]:
    body = {"model_type": MODEL_TYPE, "architectures": list(ARCHITECTURES), "hidden_size": config.hidden_size,
            "vocab_size": config.vocab_size, "num_heads": config.num_speculative_tokens,
            "num_hidden_layers": config.medusa_num_layers, "truncated_vocab_size": config.vocab_size,
            "medusa_fc_bias": True, "original_lm_head": False}
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in state.items() if k not in ("d2t", "t2d")}
    return body, tensors


def expected(config: HeadConfig, facts: TargetFacts) -> FormatSpec:
    text = facts.text
    h, vocab = int(text["hidden_size"]), int(text["vocab_size"])
    if config.uses_draft_vocab:
        raise ExportError(FULL_VOCAB.format(vocab=vocab, draft=config.draft_vocab_size))
    heads, layers = config.num_speculative_tokens, config.medusa_num_layers
    fields = {
        "model_type": Expect(MODEL_TYPE), "architectures": Expect(list(ARCHITECTURES)),
        "hidden_size": Expect(h), "vocab_size": Expect(vocab), "num_heads": Expect(heads),
        "num_hidden_layers": Expect(layers, "ResBlocks per head"),
        "truncated_vocab_size": Expect(vocab, "vLLM builds every lm_head with vocab_size rows", also=(ABSENT,)),
        "medusa_fc_bias": Expect(True, "without it vLLM builds bias-free ResBlocks and drops the trained biases"),
        "original_lm_head": Expect(False, "one lm_head per head", also=(ABSENT,)),
    }
    tensors: dict = {}
    for i in range(heads):
        for j in range(layers):
            tensors[f"blocks.{i}.layers.{j}.weight"] = ((h, h), None)
            tensors[f"blocks.{i}.layers.{j}.bias"] = ((h,), None)
        tensors[f"lm_heads.{i}.weight"] = ((vocab, h), None)
    return FormatSpec("vllm", config.method, fields, tensors)


def claims(config: dict) -> bool:
    return bool(set(ARCHITECTURES) & set(config.get("architectures") or [])) or config.get("model_type") == MODEL_TYPE


def check_extra(config: dict) -> list[str]:
    """Keys MedusaConfig would rename onto num_heads/num_hidden_layers."""
    if not claims(config):
        return []
    clobber = [k for k in config if "num" in k and (("heads" in k and k != "num_heads")
                                                     or ("layers" in k and k != "num_hidden_layers"))]
    return [f"config field {k!r} would be renamed by vLLM's MedusaConfig onto num_heads/num_hidden_layers; expected "
            f"absent" for k in clobber]


def read(config: dict, tensors: dict, *, num_layers: int, where: str) -> tuple[HeadConfig, dict]:
    # MedusaConfig.from_pretrained renames every key holding "num" + "heads"/"layers".
    renamed = dict(config)
    for key in list(config):
        if "num" in key and "heads" in key:
            renamed["num_heads"] = renamed.pop(key)
        elif "num" in key and "layers" in key:
            renamed["num_hidden_layers"] = renamed.pop(key)
    vocab = int(renamed["vocab_size"])
    truncated = int(get_field(renamed, "truncated_vocab_size", vocab))
    short = sorted({int(v.shape[0]) for k, v in tensors.items() if k.startswith("lm_heads.")} - {vocab})
    if truncated != vocab or short:
        raise ExportError(f"{where}: " + FULL_VOCAB.format(vocab=vocab, draft=short[0] if short else truncated))
    if get_field(renamed, "original_lm_head", False):
        raise ExportError(f"{where}: original_lm_head is true (one shared lm_head); expected false")
    head_config = HeadConfig(method="medusa", model_type="llama", hidden_size=int(renamed["hidden_size"]),
                             vocab_size=vocab, draft_vocab_size=vocab,
                             num_speculative_tokens=int(get_field(renamed, "num_heads", 5)), aux_layer_ids=[FINAL],
                             medusa_num_layers=int(get_field(renamed, "num_hidden_layers", 1)))
    state = {k: v for k, v in tensors.items() if k.startswith(("blocks.", "lm_heads."))}
    if not get_field(renamed, "medusa_fc_bias", False):
        # vLLM builds bias-free ResBlocks and drops the stored biases: exactly a zero bias.
        state = {k: (torch.zeros_like(v) if k.endswith(".bias") else v) for k, v in state.items()}
    state.update(read_vocab_maps(None, vocab, vocab, where=where))
    return head_config, state


def notes(config: HeadConfig, facts: TargetFacts) -> list[str]:
    return ["vLLM versions: Medusa is served by vLLM 0.15–0.32 only (their releases ship medusa.py; loaded with "
            "vLLM 0.32.0's own Medusa class by scripts/check_engines.py). vLLM 0.33 removed Medusa (no "
            "medusa.py, no \"medusa\" method): for vLLM >= 0.33 train and export an EAGLE-3 drafter."]


EXPORTS = {"vllm": FormatExport(architectures=ARCHITECTURES, serve_as="medusa", check=check, support=support,
                                build=build, expected=expected, claims=claims, read=read, notes=notes,
                                check_extra=check_extra, full_vocab_only=True)}
