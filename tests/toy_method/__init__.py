"""A drafting method from outside the project's packages, as a contributor's own package would add one: this folder
and the one `register` below are all of it (tests/test_method_registry.py trains it, drafts with it, and exports
it). The toy: one linear layer over the target's last final feature guesses the token after the pending one."""
from __future__ import annotations

from draftsmith.serve.core.layers import FINAL
from draftsmith.serve.methods import Method, register
from tests.toy_method.head import ToyDrafter, ToyHead, toy_config
from tests.toy_method.objective import ToyObjective

METHOD = register(Method(name="toy", title="Toy", config=lambda model, target: toy_config(target),
                         head=ToyHead, drafter=ToyDrafter,
                         objective=lambda head, parts, settings: ToyObjective(head, parts),
                         layers=lambda num_layers: (FINAL,)))
