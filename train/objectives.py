"""The training objective of a head: its method folder builds it (serve/methods/<name>/objective.py) from the
recipe's loss settings."""
from __future__ import annotations

from draftsmith.serve.methods.objective import Objective, ObjectiveSettings, TargetParts
from draftsmith.serve.methods.registry import method


def build_objective(head, parts: TargetParts, **settings) -> Objective:
    """The Objective of `head`'s method; settings: the ObjectiveSettings fields (ttt_steps, decay, ...)."""
    return method(head.config.method, what="drafter method", trained=True).objective(head, parts, ObjectiveSettings(**settings))
