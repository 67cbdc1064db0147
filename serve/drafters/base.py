"""The drafter interface the speculative decoder drives.

Timeline of one generation (batch 1). `seq` are the tokens the target has processed (their KV
entries are cached); `pending` is the last sampled token, not yet seen by the target.

    prefill:  target(prompt)                 -> first token t0 = pending
              drafter.begin(prompt_ids, next_tokens=prompt_ids[1:] + [t0], hidden_states=H(prompt))
    cycle:    draft = drafter.propose(k)     -> tokens continuing after `pending`
              target([pending] + draft)      -> accept m drafts, then sample t (correction or bonus)
              drafter.commit(next_tokens=[d1..dm, t], hidden_states=H([pending, d1..dm]))
              pending = t

`hidden_states[j]` is the target's feature at the position whose next token is `next_tokens[j]`
(EAGLE's pairing of feature f_i with token x_{i+1}). They are a dict keyed by layer id in the
convention of DESIGN.md: id i = output of decoder layer i = HF `hidden_states[i + 1]`; the key
`FINAL` is the last, normed state (what the lm_head reads). A drafter asks for the layers it needs
through `target_layers`; drafters that need none get empty dicts and the target runs cheaper.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, ClassVar, Iterator

import torch

from draftsmith.serve.core.layers import FINAL  # noqa: F401  (the key of the final normed state in `hidden_states`)
from draftsmith.serve.tree import TreeSpec
from draftsmith.serve.core.target import Target


@dataclass
class Draft:
    """Proposed tokens: a chain (`parents is None`) or a tree.

    tokens:  (n,) long. Chain: d1..dn in order. Tree: nodes in topological order (parent before child).
    parents: (n,) long or None. parents[i] = index of node i's parent, -1 for children of `pending`.
    q:       (n, V) float or None. The distribution each chain token was *sampled* from (stochastic
             chain drafters only). None means deterministic proposals: the decoder then verifies
             exactly with q one-hot per node (trees always use this form).
    """
    tokens: torch.Tensor
    parents: torch.Tensor | None = None
    q: torch.Tensor | None = None

    @classmethod
    def empty(cls) -> "Draft":
        """No drafts: the cycle is a plain step."""
        return cls(torch.empty(0, dtype=torch.long))

    def __len__(self) -> int:
        return int(self.tokens.numel())

    @property
    def is_tree(self) -> bool:
        return self.parents is not None

    def leading_chain(self) -> "Draft":
        """The chain this draft starts with: itself when a chain; for a tree, its first nodes while each is the child
        of the one before (a greedy chain carrying leaves lists its chain first). A tree's nodes are deterministic
        proposals, so their chain verifies exactly as one (on a cache that cannot keep a tree's path)."""
        if not self.is_tree:
            return self
        parents = self.parents.tolist()
        n = 0
        while n < len(parents) and parents[n] == n - 1:
            n += 1
        return Draft(tokens=self.tokens[:n])


class Drafter:
    """Base class. Subclasses set `kind` and override `propose`; `begin`/`commit` keep their state."""

    kind: ClassVar[str] = "base"
    target_layers: tuple[int, ...] = ()  # layer ids whose hidden states the drafter needs (FINAL allowed)
    # What it records about how to draft (a trained folder's config.json); flags override, see settings.py.
    default_k: int | None = None  # None: no preference (DEFAULT_K)
    default_tree: TreeSpec | None = None  # None: chains
    # attributes every fork shares with its origin (fork); weights, the target and tokenizers are always shared
    shared_state: ClassVar[tuple[str, ...]] = ()
    # it attends to the target's own keys and values (watch_cache): the batched decoder hands it its row's each cycle
    reads_target_cache: ClassVar[bool] = False

    def begin(self, prompt_ids: torch.Tensor, next_tokens: torch.Tensor,
              hidden_states: dict[int, torch.Tensor]) -> None:
        """prompt_ids: (T,); next_tokens: (T,) = prompt_ids[1:] + [t0]; hidden_states[l]: (T, h)."""

    def watch_cache(self, cache) -> None:
        """The target's KV cache: at batch 1 the generation's (serve/core/kv.py), handed over before the prefill; in
        the batched decoder the row's view of its slot cache (serve/core/slots.py `SlotCache.row`), handed before each
        cycle's drafting. Either reads as transformers' DynamicCache (`layers[i].keys`, `.values`) and holds, when
        the drafter proposes, exactly the tokens the target has seen (the pending one not; sliding layers: at least
        the last window - 1 of them), so a drafter that attends to the target's keys and values (Gemma 4's
        assistant) reads them there rather than recomputing them. Ignored by default."""

    def draft_cap(self, k: int) -> int:
        """The most tokens a cycle of this drafter may draft when the decoder's K is k: k, unless the drafter's
        proposals cost nothing to extend and its length policy weighs each token (the n-gram drafter)."""
        return k

    def propose(self, k: int, *, temperature: float = 0.0, generator: torch.Generator | None = None) -> Draft:
        raise NotImplementedError

    def commit(self, next_tokens: torch.Tensor, hidden_states: dict[int, torch.Tensor]) -> None:
        """next_tokens: (m+1,) = accepted drafts then the new token; hidden_states[l]: (m+1, h)."""

    def check_target(self, target: Target) -> None:
        """Raise serve.core.errors.DraftsmithError if this drafter cannot serve `target` (tokenizer, config)."""

    def chain_acceptance(self, draft: Draft) -> list[float] | None:
        """P(accepted) of each chain token of `draft`, this drafter's last proposal, as its length policy estimated
        them; None when unknown (a fixed length, a tree). A greedy chain carrying leaves lists the chain first
        (serve/drafters/leaves.py): the estimates cover those first nodes."""
        kept = getattr(getattr(self, "policy", None), "kept", None)
        if kept is None:
            return None
        n = len(kept)
        if n > len(draft) or (n < len(draft) and not draft.is_tree):
            return None
        if draft.is_tree and draft.parents[:n].tolist() != list(range(-1, n - 1)):
            return None
        return list(kept)

    def parts(self) -> tuple["Drafter", ...]:
        """The drafters that draft for this one (a hybrid: both sides'), for `prepare_batch`."""
        return (self,)

    @classmethod
    def propose_rows(cls, drafters: list["Drafter"], calls: list[dict]) -> list[Draft]:
        """The proposals of a batch's rows whose drafters are all of this kind, drafter i's `propose(**calls[i])`:
        row by row here; a kind that can draft the rows together overrides it."""
        return [drafter.propose(**call) for drafter, call in zip(drafters, calls)]

    @classmethod
    def prepare_rows(cls, drafters: list["Drafter"]) -> None:
        """Called with the drafters of this kind of every row of a batch, before each row's `propose`: a drafter that
        can run the rows' forwards together does it here, once (none by default)."""

    def fork(self) -> "Drafter":
        """A drafter for another sequence of a batch: the same weights, target and settings, its own state (its
        length policy starts from what this one has learned). begin() then starts its sequence."""
        memo: dict[int, Any] = {}
        _share(self, memo, set())
        return copy.deepcopy(self, memo)

    def policies(self) -> Iterator[Any]:
        """The length policies this drafter drafts by (a hybrid: both sides')."""
        seen: set[int] = set()
        for value in vars(self).values():
            found = [value] if _is_policy(value) else list(value.policies()) if isinstance(value, Drafter) else []
            for policy in found:
                if id(policy) not in seen:
                    seen.add(id(policy))
                    yield policy


def prepare_batch(drafters: list[Drafter]) -> None:
    """Before a batch's rows propose: each kind of drafter among the rows (a hybrid's parts counted) prepares its
    rows together (`Drafter.prepare_rows`), a kind with one row alone left to its own `propose`."""
    kinds: dict[type, list[Drafter]] = {}
    for drafter in drafters:
        for part in drafter.parts():
            kinds.setdefault(type(part), []).append(part)
    for kind, rows in kinds.items():
        if len(rows) > 1:
            kind.prepare_rows(rows)


def propose_batch(drafters: list[Drafter], calls: list[dict | None]) -> list[Draft]:
    """The drafts of a batch's rows: drafter i proposes with `calls[i]` (None: an empty draft), the rows of each
    kind together (`Drafter.propose_rows`)."""
    drafts = [Draft.empty()] * len(drafters)
    kinds: dict[type, list[int]] = {}
    for i, (drafter, call) in enumerate(zip(drafters, calls)):
        if call is not None:
            kinds.setdefault(type(drafter), []).append(i)
    for kind, rows in kinds.items():
        for i, draft in zip(rows, kind.propose_rows([drafters[i] for i in rows], [calls[i] for i in rows])):
            drafts[i] = draft
    return drafts


def _is_policy(value: Any) -> bool:
    return hasattr(value, "offer") and hasattr(value, "new_context")


def _is_shared(value: Any) -> bool:
    """Weights, a target (its model and tokenizer), a tokenizer, anything callable (a module, an embedding lookup, a
    function): read-only while drafting, never copied."""
    if isinstance(value, Drafter):
        return False
    if isinstance(value, torch.nn.Parameter) or callable(value):
        return True
    if hasattr(value, "model") and hasattr(value, "tokenizer"):  # draftsmith.serve.core.target.Target
        return True
    return hasattr(value, "encode") and hasattr(value, "decode") and hasattr(value, "vocab_size")  # a tokenizer


def _share(obj: Any, memo: dict[int, Any], seen: set[int]) -> None:
    """Put every shared object reachable from a drafter into deepcopy's memo, so copies point at the original."""
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, Drafter):
        for name in obj.shared_state:
            memo[id(getattr(obj, name))] = getattr(obj, name)
    children = vars(obj).values() if hasattr(obj, "__dict__") and not isinstance(obj, type) else \
        obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (list, tuple)) else ()
    for value in children:
        if _is_shared(value):
            memo[id(value)] = value
        elif isinstance(value, (dict, list, tuple)) or hasattr(value, "__dict__"):
            _share(value, memo, seen)
