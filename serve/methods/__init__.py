"""Drafting methods, one folder each (eagle1/, eagle3/, medusa/), and the one registry that names them
(serve/methods/registry.py). What the methods share lives beside them: the objective protocol (objective.py) and the
losses as pure tensor functions (losses.py)."""
from __future__ import annotations

from draftsmith.serve.methods.registry import Method, MethodError, method, names, register

__all__ = ["Method", "MethodError", "method", "names", "register"]
