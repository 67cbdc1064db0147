"""Drafter specs checked before the target's weights load: a folder that is not there, is damaged, or was trained
for another target is refused in seconds (the target's config and tokenizer only), not after loading it whole.
`build_drafter` checks the same again on the loaded target."""
from __future__ import annotations

from typing import Any, Iterable

from draftsmith.serve.drafters.spec import FOLDER, parse_drafter_spec


def folders(specs: Iterable[str]) -> list[str]:
    """The drafter folders the spec strings name (a hybrid's head included); ngram, oracle and model:PATH none."""
    found = []
    for spec in specs:
        parsed = parse_drafter_spec(spec).named  # a path that is no folder fails here
        if parsed.kind == FOLDER:
            found.append(parsed.path)
    return found


def check_before_loading(specs: Iterable[str], target_spec: Any) -> None:
    """Raise DraftsmithError (one line) for a spec naming no drafter, a damaged folder, or one trained for another
    target than `target_spec` (a spec string; a loaded target is checked by build_drafter instead)."""
    paths = folders(specs)
    if not paths or not isinstance(target_spec, str):
        return
    from draftsmith.serve.core.target import load_target
    from draftsmith.serve.drafters.folder import read_config
    from draftsmith.serve.drafters.identity import check_target_identity

    probe = load_target(target_spec, weights=False)  # config and tokenizer: what the identity check reads
    for path in paths:
        check_target_identity(read_config(path), probe)
