"""The length policy a drafter built for a target drafts by (serve/drafters/length.py), its verify costs measured on
that target."""
from __future__ import annotations

from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.drafters.spec import DrafterSpecError
from draftsmith.serve.core.target import Target


def length_policy(target: Target, length: str, **gain_options):
    """`auto`: the expected-gain policy with `gain_options`, its verify costs measured now (once per model and thread
    count, so the first generation's timing does not include it); `fixed`: K every cycle."""
    from draftsmith.serve.core.costs import verify_costs_for
    from draftsmith.serve.drafters.length import build_policy

    try:
        return build_policy(length, costs=verify_costs_for(target.model) if length == "auto" else None,
                            **(gain_options if length == "auto" else {}))
    except DraftsmithError as err:
        raise DrafterSpecError(str(err)) from None
