"""A drafter serves only the target it was trained for: same tokenizer (token ids) and same architecture."""
from __future__ import annotations

from draftsmith.serve.drafters.head_config import HeadConfig
from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.core.target import Target, text_config


def check_target_identity(config: HeadConfig, target: Target) -> None:
    """A drafter serves only the target it was trained for: same tokenizer (ids) and same architecture."""
    problems = []
    if config.target_tokenizer_hash and config.target_tokenizer_hash != target.tokenizer_hash:
        problems.append(f"tokenizer hash {target.tokenizer_hash} != {config.target_tokenizer_hash} (token ids "
                        f"would mean different text)")
    if config.target_config_hash and config.target_config_hash != target.config_hash:
        problems.append(f"config hash {target.config_hash} != {config.target_config_hash} (a different model "
                        f"architecture)")
    if problems:
        raise DraftsmithError(f"this {config.method} drafter was trained for target {config.target_name!r} "
                              f"(tokenizer {config.target_tokenizer_hash}, config {config.target_config_hash}) but "
                              f"is being used with {target.name!r}: " + "; ".join(problems)
                              + ". Train a drafter for this target (draftsmith train).")
    text = text_config(target.config)
    if text.hidden_size != config.hidden_size or text.vocab_size != config.vocab_size:
        raise DraftsmithError(f"drafter expects hidden size {config.hidden_size} and vocabulary {config.vocab_size}; "
                              f"target {target.name!r} has {text.hidden_size} and {text.vocab_size}")
