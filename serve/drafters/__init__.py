"""Drafters by name: `ngram[:max_n=4,min_n=2]`, `model:PATH`, `oracle`, or a native drafter folder
(`DIR`, or `DIR:min_confidence=0.3` to stop chains where the draft is unsure)."""
from __future__ import annotations

import json
from pathlib import Path

from serve.drafters.base import Draft, Drafter
from serve.errors import DraftsmithError
from serve.layers import FINAL

__all__ = ["FINAL", "Draft", "Drafter", "build_drafter", "DrafterSpecError"]


class DrafterSpecError(DraftsmithError):
    pass


def _options(text: str) -> dict[str, str]:
    opts = {}
    for item in filter(None, text.split(",")):
        if "=" not in item:
            raise DrafterSpecError(f"drafter option {item!r} is not key=value")
        key, value = item.split("=", 1)
        opts[key.strip()] = value.strip()
    return opts


def is_drafter_folder(path: str | Path) -> bool:
    config = Path(path) / "config.json"
    return config.is_file() and "draftsmith_drafter" in json.loads(config.read_text())


def build_drafter(spec: str, target, **opts) -> Drafter:
    """Build a drafter for `target` from a spec string; checks it can serve that target."""
    kind, _, rest = spec.partition(":")
    if kind == "ngram":
        from serve.drafters.ngram import NgramDrafter

        parsed = {k: int(v) for k, v in _options(rest).items()}
        unknown = set(parsed) - {"max_n", "min_n"}
        if unknown:
            raise DrafterSpecError(f"unknown ngram option(s) {sorted(unknown)}; valid: max_n, min_n")
        drafter = NgramDrafter(**{**parsed, **opts})
    elif kind == "oracle":
        from serve.drafters.oracle import OracleDrafter

        drafter = OracleDrafter(target, **opts)
    elif kind == "model":
        if not rest:
            raise DrafterSpecError("the model drafter needs a path: model:PATH_TO_SMALL_LM")
        from serve.drafters.model import ModelDrafter
        from serve.target import load_target

        small = load_target(rest, dtype=target.model.dtype, device=str(target.model.device))
        drafter = ModelDrafter(small.model, small.tokenizer, target_vocab_size=target.model.config.vocab_size
                               if not hasattr(target.model.config, "text_config")
                               else target.model.config.text_config.vocab_size)
    elif not Path(spec).is_dir() and Path(spec.rpartition(":")[0]).is_dir() and "=" in spec.rpartition(":")[2]:
        folder, _, rest = spec.rpartition(":")
        try:
            return build_drafter(folder, target, **{**_options(rest), **opts})
        except ValueError as err:
            raise DrafterSpecError(f"bad drafter option in {spec!r}: {err}") from None
    elif Path(spec).is_dir():
        if not is_drafter_folder(spec):
            raise DrafterSpecError(f"{spec} is not a draftsmith drafter folder (its config.json has no "
                                   f"'draftsmith_drafter' entry); train one with `draftsmith train`")
        from serve.drafters.folder import load_drafter

        drafter = load_drafter(spec, target, **opts)
    else:
        raise DrafterSpecError(f"unknown drafter {spec!r}: use ngram, ngram:max_n=3, oracle, model:PATH, "
                               f"or a trained drafter folder")
    drafter.check_target(target)
    return drafter
