"""Which target families an engine can host an EAGLE draft on: the engines' columns of the family table
(serve/core/families.py), read from their released code, asked by the exporters before anything is written.

The draft layer is a Llama layer for every family (serve/drafters/draft_layer.py); what differs is the TARGET's class
in the engine, which may also serve the family's checkpoints only with a tied lm_head (a row's `untied`). Check again
per release.
"""
from __future__ import annotations

from dataclasses import dataclass

from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.core.families import FAMILIES, family_of, text_family

__all__ = ["HOSTS", "Hosts", "check_hosted", "text_family"]


@dataclass(frozen=True)
class Hosts:
    engine: str
    read_in: str                           # the releases whose code was read
    any_family: tuple[str, ...] = ()       # capabilities any target class hosts (vLLM's EAGLE-1 needs nothing of it)

    def refusal(self, capability: str, family: str, version: str | None) -> str | None:
        """None when `family` hosts a draft needing `capability` (`EAGLE-3`, `EAGLE-1`); else one line naming the
        engine, the version and what its class lacks."""
        if capability in self.any_family:
            return None
        row = family_of(family)
        read = None if row is None else row.hosts.get(self.engine)
        if read is not None and capability in read and read[capability] is None:
            return None
        release = f"{self.engine} {version}" if version else f"{self.engine} (read in {self.read_in})"
        if read is not None and read.get(capability):
            why = f"its {row.causal_lm} {read[capability]}"
        else:
            known = [f.model_type for f in FAMILIES if capability in f.hosts.get(self.engine, {})
                     and f.hosts[self.engine][capability] is None]
            why = f"draftsmith has not read {self.engine}'s code for {family!r} targets (it knows {', '.join(known)})"
        return f"{release} cannot host an {capability} drafter for a {family!r} target: {why}"

    def untied_refusal(self, family: str, version: str | None) -> str | None:
        """None unless the engine's class for `family` cannot serve a target whose lm_head is not its embedding
        matrix; else one line saying why."""
        row = family_of(family)
        why = None if row is None else row.untied.get(self.engine)
        if why is None:
            return None
        release = f"{self.engine} {version}" if version else f"{self.engine} (read in {self.read_in})"
        return f"{release} cannot serve a {family!r} target whose lm_head is untied: its {row.causal_lm} {why}"


VLLM = Hosts(engine="vLLM", read_in="0.33.0-0.34.0", any_family=("EAGLE-1",))
SGLANG = Hosts(engine="SGLang", read_in="0.5.23")
HOSTS = {"vllm": VLLM, "speculators": VLLM, "sglang": SGLANG}  # speculators folders are served by vLLM


def check_hosted(capability: str | None, target_model_type: str, fmt: str, version: str | None = None, *,
                 tied: bool | None = None) -> None:
    """Raise (one line) when the engine behind `fmt` cannot host a draft needing `capability` (the method's form's
    `hosted_as`; None: any target class hosts it) on this target family, or (`tied` False: the target's lm_head is
    not its embedding matrix; None: not known yet) cannot serve the target untied."""
    if capability is None or not target_model_type:
        return
    family = text_family(target_model_type)

    def refusal(hosts: Hosts, release: str | None) -> str | None:
        return hosts.refusal(capability, family, release) or (
            hosts.untied_refusal(family, release) if tied is False else None)

    problem = refusal(HOSTS[fmt], version)
    if problem:
        other = [f for f, hosts in HOSTS.items() if hosts is not HOSTS[fmt] and refusal(hosts, None) is None]
        fix = f"export --format {other[0]} instead" if other else "serve it with `draftsmith serve`"
        raise DraftsmithError(f"--format {fmt}: {problem}. {fix[0].upper()}{fix[1:]}.")
