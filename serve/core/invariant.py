"""Batch-invariant target forwards: each token's logits computed the same way alone, verified with drafts, or in a batch.

Speculative decoding is exact only if the target scores a position identically in a one-token step and in a
verify forward over K+1 tokens (or a batch of rows). In float32 the kernels' rounding differences stay far below
the gaps between logits; in bfloat16 and float16 they do not: on the default target a one-row `F.linear` (an
AVX512-BF16 EPYC) or a multi-query attention (an AMX Xeon) rounds one ulp away from the one-token step, the
difference grows through the layers and flips near-tie argmaxes (the demo read 39/104 outputs identical).

The cure is the one the field uses on GPUs (Thinking Machines, "Defeating Nondeterminism in LLM Inference";
vLLM's `VLLM_BATCH_INVARIANT`; SGLang's deterministic inference): make every reduction's order independent of how
many rows are computed together. Two operations carry a reduction whose kernel depends on the row count:
- every linear layer: `InvariantLinear` runs the rows in tiles of exactly TILE_ROWS (the last one zero-padded), so
  the matmul kernel, and with it each row's summation order, is the same for 1 row as for 300. A prompt's prefill
  is the one forward every decoder runs alike (the whole prompt, alone: `whole_prompt`), and runs in one call;
- attention: `invariant_attention` attends each query alone (one query row, the SDPA call a one-token step makes)
  over exactly the keys it may see, gathered contiguous from the mask. A verify forward, a tree, a left-padded
  batch row with masked holes and a one-token step then run the same call on the same keys.
Norms, RoPE and activations are per-row and elementwise; they need nothing.

`make_invariant(model)` switches a loaded target over (in place, undone by `make_variant`); eval's cost section
(eval/costs.py) and scripts/bench/invariance.py measure what it costs. It refuses, with the reason, what it cannot
make invariant: attention with sinks or soft-capping, and mixture-of-experts layers (their fused experts multiply
as many rows as the router sends each one).
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import sys
import weakref
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from draftsmith.serve.core.attention import with_indices
from draftsmith.serve.core.errors import TargetError
from draftsmith.serve.core.packed import pack_linears, packed_linear, packs_bf16, unpack_linears
from draftsmith.serve.core.target_config import INVARIANT_SETTINGS as SETTINGS

NAME = "draftsmith_invariant"  # the attention implementation registered with transformers
# rows per matmul tile: one kernel for every row count. A row's result depended on the call's row count past 32
# rows on an AMX Xeon and at 1 row on an AVX512-BF16 EPYC; 8 rows are inside both. A one-token step pays for 8 rows
# (bf16, default target, 2 AMX cores: its linears 8% slower, 24% at 16 rows) and a verify of up to 7 drafts too
TILE_ROWS = 8
LOW_PRECISION = (torch.bfloat16, torch.float16)


# set inside `whole_prompt`: the forward is one prompt's prefill, alone, which every decoder computes the same way
_WHOLE_PROMPT: contextvars.ContextVar[bool] = contextvars.ContextVar("draftsmith_whole_prompt", default=False)


@contextlib.contextmanager
def whole_prompt():
    """The forward inside is one whole prompt (batch 1, from its first token, nothing cached): every decoder
    prefills a prompt so, so its linears may run all rows in one call, the fastest kernel for a long prompt, and
    still give the same rows everywhere. An invariant model's forward sets it itself where its cache is empty
    (`_opens_a_prompt`); the batched decoder's slot cache cannot tell, and the decoder says it here."""
    token = _WHOLE_PROMPT.set(True)
    try:
        yield
    finally:
        _WHOLE_PROMPT.reset(token)


class InvariantLinear(nn.Linear):
    """An nn.Linear (same parameters, same state dict) whose forward runs its rows in tiles of TILE_ROWS (all in one
    call inside `whole_prompt`), on oneDNN's packed weight where `packed` (serve/core/packed.py `packs_bf16`: the
    same kernel for every tile, so the same invariance)."""

    packed = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        linear = self._packed if self.packed else self._plain
        if _WHOLE_PROMPT.get():
            return linear(x)
        flat = x.reshape(-1, self.in_features)  # (rows, in)
        rows = flat.shape[0]
        flat = F.pad(flat, (0, 0, 0, -rows % TILE_ROWS))  # (tiles * TILE_ROWS, in), zero rows appended
        if flat.shape[0] == TILE_ROWS:
            out = linear(flat)
        else:
            out = torch.cat([linear(tile) for tile in flat.split(TILE_ROWS)])
        return out[:rows].reshape(*x.shape[:-1], self.out_features)

    def _plain(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)

    def _packed(self, x: torch.Tensor) -> torch.Tensor:
        return packed_linear(self, x)


@dataclass(frozen=True)
class _RowPlan:
    """How one batch row's queries attend: `prompt` = s when queries s.. are a whole prompt attended in one call
    (the queries before it left padding), and each other query q alone over keys[start:stop] or keys[index]."""
    prompt: int | None
    alone: tuple[tuple[int, int, int, torch.Tensor | None], ...]  # (q, start, stop, index or None)


def _visible(attention_mask: torch.Tensor, keys: int) -> torch.Tensor:
    """(B, 1, Q, L') bool or additive mask -> (B, Q, L) bool: which keys each query may see."""
    mask = attention_mask
    if mask.dtype != torch.bool:  # additive: 0 where allowed, a large negative number where not
        mask = mask > torch.finfo(mask.dtype).min / 2
    return mask[:, 0, :, :keys]  # a mask may be built longer than the cache a layer holds (one mask for all heads)


def _alone(q: int, visible: torch.Tensor) -> tuple[int, int, int, torch.Tensor | None]:
    """(L,) bool of query q -> (q, start, stop, None) when its keys are one contiguous run, else (q, 0, 0, index)."""
    index = visible.nonzero().flatten()  # (n,) ascending
    first, last = (int(index[0]), int(index[-1])) if index.numel() else (0, -1)
    if last - first + 1 == index.numel():
        return q, first, last + 1, None
    return q, 0, 0, index


def _prompt_start(visible: torch.Tensor) -> int | None:
    """visible: (L, L) bool of a forward over L new tokens -> s when its rows from s on are one whole prompt
    attended causally from its first token (a sliding window may drop keys), the rows before s left padding that
    no prompt token sees; else None."""
    length = visible.shape[0]
    seen_later = visible.tril(-1).any(0)  # (L,): a column some later query sees
    start = int(seen_later.nonzero()[0]) if seen_later.any() else length - 1
    inside = visible[start:, start:]
    causal = torch.ones_like(inside).tril_()
    if (inside & ~causal).any() or not inside.diagonal().all() or visible[start:, :start].any():
        return None
    return start


@functools.lru_cache(maxsize=64)
def _causal_plan(batch: int, queries: int, keys: int) -> tuple[_RowPlan, ...]:
    """No mask: the queries are the last Q positions, each seeing every key up to its own."""
    if queries == keys:
        return (_RowPlan(prompt=0, alone=()),) * batch
    return (_RowPlan(prompt=None, alone=tuple((q, 0, keys - queries + q + 1, None) for q in range(queries))),) * batch


# the plans of the masks seen last: every layer of a forward gets the same mask object (one per attention type),
# so a forward plans once; a weak reference tells a live mask from a new one at the same address
_PLANS: dict[int, tuple[weakref.ref, int, tuple[_RowPlan, ...]]] = {}


def _plan(attention_mask: torch.Tensor | None, batch: int, queries: int, keys: int) -> tuple[_RowPlan, ...]:
    if attention_mask is None:
        return _causal_plan(batch, queries, keys)
    held = _PLANS.get(id(attention_mask))
    if held is not None and held[0]() is attention_mask and held[1] == keys:
        return held[2]
    visible = _visible(attention_mask, keys).expand(batch, queries, keys).cpu()  # (B, Q, L)
    plans = []
    for b in range(batch):
        start = _prompt_start(visible[b]) if queries == keys else None
        plans.append(_RowPlan(prompt=start, alone=tuple(_alone(q, visible[b, q]) for q in
                                                        range(queries if start is None else start))))
    if len(_PLANS) > 8:
        _PLANS.clear()
    _PLANS[id(attention_mask)] = (weakref.ref(attention_mask), keys, tuple(plans))
    return tuple(plans)


def invariant_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                        **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention interface. query: (B, H, Q, D); key, value: (B, KVH, L, D); attention_mask: None
    (causal) or (B, 1, Q, L) bool / additive -> (B, Q, H, D).

    A prompt's prefill (a forward that writes every key it reads) attends its whole prompt in one call over the
    prompt's own columns, the same whether the prompt came alone or left-padded in a batch. Any other forward (a
    decoding step, a verify forward, a tree, a batch of rows with masked holes) attends each query alone over
    its visible keys, gathered contiguous: a one-token step's call."""
    if kwargs.get("softcap") is not None or getattr(module, "sinks", None) is not None:
        raise TargetError("batch-invariant attention has no soft-capping or attention sinks: load the target with "
                          "target.invariant=off")
    batch, heads, queries, _ = query.shape
    keys = key.shape[2]
    gqa = key.shape[1] != heads
    attention_mask = with_indices(attention_mask, kwargs.pop("indices", None), keys)  # DeepSeek-V3.2's selection
    rows = []
    for b, row in enumerate(_plan(attention_mask, batch, queries, keys)):
        q_b, k_b, v_b = query[b: b + 1], key[b: b + 1], value[b: b + 1]
        parts = []  # (1, H, n, D) each, in query order
        for q, start, stop, index in row.alone:
            if index is None and stop == start:  # a padding query that sees nothing (transformers' left padding)
                parts.append(q_b.new_zeros(1, heads, 1, q_b.shape[-1]))
                continue
            k, v = (k_b[:, :, start:stop], v_b[:, :, start:stop]) if index is None else \
                (k_b.index_select(2, index.to(k_b.device)), v_b.index_select(2, index.to(v_b.device)))
            parts.append(F.scaled_dot_product_attention(q_b[:, :, q: q + 1], k, v, scale=scaling, enable_gqa=gqa))
        if row.prompt is not None:
            prompt = slice(row.prompt, keys)
            length = keys - row.prompt
            causal = torch.ones(length, length, dtype=torch.bool, device=query.device).tril_()
            mask = causal if attention_mask is None else \
                _visible(attention_mask[b: b + 1], keys)[0, prompt, prompt].to(query.device)  # (T, T)
            parts.append(F.scaled_dot_product_attention(
                q_b[:, :, prompt].contiguous(), k_b[:, :, prompt].contiguous(), v_b[:, :, prompt].contiguous(),
                attn_mask=mask[None, None], scale=scaling, enable_gqa=gqa))
        rows.append(torch.cat(parts, dim=2) if len(parts) > 1 else parts[0])
    out = torch.cat(rows) if batch > 1 else rows[0]  # (B, H, Q, D)
    return out.transpose(1, 2), None


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(NAME, invariant_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)  # the same boolean masks SDPA gets


def invariance_wanted(model: nn.Module, setting: str = "auto") -> bool:
    """Whether `setting` (auto | on | off) makes `model` invariant: auto does for bfloat16 and float16 weights,
    where kernels' rounding flips tokens; float32's stays below the logits' gaps (the eval's audit checks it)."""
    if setting not in SETTINGS:
        raise TargetError(f"target.invariant: choose one of {', '.join(SETTINGS)}, got {setting!r}")
    if setting == "off":
        return False
    param = next(model.parameters(), None)
    return setting == "on" or (param is not None and param.dtype in LOW_PRECISION)


def unsupported_reason(model: nn.Module) -> str | None:
    """Why `model`'s forward cannot be made invariant here, or None."""
    config = getattr(model.config, "text_config", None) or model.config
    if getattr(config, "attn_logit_softcapping", None):
        return f"{config.model_type} soft-caps its attention scores"
    if any(getattr(m, "sinks", None) is not None for m in model.modules()):
        return f"{config.model_type} has attention sinks"
    if any(p.dim() == 3 for m in model.modules() if type(m).__name__.endswith("Experts") for p in m.parameters()):
        return f"{config.model_type}'s experts multiply as many rows as the router sends them"
    return None


def make_invariant(model: nn.Module) -> None:
    """Switch `model` (a loaded transformers causal LM) to batch-invariant forwards, in place."""
    reason = unsupported_reason(model)
    if reason:
        raise TargetError(f"batch-invariant forwards are not available for this target: {reason}")
    model.__dict__.pop("_draftsmith_linears", None)  # listed anew: a layer replaced since the last list is switched
    _switch_to_invariant(model)


def _linears(model: nn.Module) -> list[nn.Linear]:
    """`model`'s linear layers, listed by each `make_invariant` and kept: `suspended` switches them twice a decoding
    step (a walk over the default target's modules costs 0.2 ms, against 0.01 ms for the list)."""
    listed = model.__dict__.get("_draftsmith_linears")
    if listed is None:
        listed = model.__dict__["_draftsmith_linears"] = [m for m in model.modules() if isinstance(m, nn.Linear)]
    return listed


def _switch_to_invariant(model: nn.Module) -> None:
    """make_invariant without the check: for a model known to be supported (it was invariant before)."""
    _register()
    packed = packs_bf16(model)
    for module in _linears(model):
        if type(module) is nn.Linear:
            module.__class__ = InvariantLinear
            module.__dict__["packed"] = packed  # not through nn.Module.__setattr__'s checks: twice a step
    model.set_attn_implementation(NAME)
    if not hasattr(model, "_draftsmith_prompt_hooks"):
        model._draftsmith_prompt_hooks = (model.register_forward_pre_hook(_enter_forward, with_kwargs=True),
                                          model.register_forward_hook(_leave_forward, always_call=True))


def _opens_a_prompt(args: tuple, kwargs: dict) -> bool:
    """Whether a model forward is one prompt's prefill: one row of input_ids and nothing cached (no cache, or an
    empty transformers Cache). The batched decoder's slot cache says so itself (whole_prompt)."""
    from transformers import Cache

    input_ids = kwargs.get("input_ids", args[0] if args else None)
    cache = kwargs.get("cache", kwargs.get("past_key_values"))
    return (isinstance(input_ids, torch.Tensor) and input_ids.dim() == 2 and input_ids.shape[0] == 1
            and (cache is None or (isinstance(cache, Cache) and cache.get_seq_length() == 0)))


def _enter_forward(model: nn.Module, args: tuple, kwargs: dict) -> None:
    """Every prompt's prefill runs whole, whoever calls the model (our decoders, transformers' generate, the
    audit): the same rows wherever the prompt is prefilled."""
    tokens = model.__dict__.setdefault("_draftsmith_prompt_tokens", [])
    tokens.append(_WHOLE_PROMPT.set(_WHOLE_PROMPT.get() or _opens_a_prompt(args, kwargs)))


def _leave_forward(model: nn.Module, args: tuple, output) -> None:
    tokens = model.__dict__.get("_draftsmith_prompt_tokens")
    if tokens:
        _WHOLE_PROMPT.reset(tokens.pop())


def apply_invariance(model: nn.Module, setting: str = "auto", *,
                     log: Callable[[str], None] | None = None) -> bool:
    """Make `model` invariant where `setting` wants it (invariance_wanted). A target it cannot make invariant is
    refused under `on`; under `auto` it says so in one line (to `log`, default stderr) and stays as it is, the eval's
    exactness audit then telling rounding flips from bugs. Returns whether the model is invariant."""
    if not invariance_wanted(model, setting):
        return False
    reason = unsupported_reason(model)
    if reason is not None:
        message = (f"batch-invariant forwards are not available for this target ({reason}): speculative output in "
                   f"{model.dtype} may differ from plain decoding where two tokens' logits round alike")
        if setting == "on":
            raise TargetError(f"{message}; set target.invariant=auto to decode without them, or load it in float32")
        (log or (lambda msg: print(msg, file=sys.stderr, flush=True)))(
            f"note: {message}; `draftsmith eval` audits every such divergence")
        return False
    make_invariant(model)
    return True


def is_invariant(model: nn.Module) -> bool:
    return getattr(model.config, "_attn_implementation", None) == NAME


@contextlib.contextmanager
def suspended(model: nn.Module):
    """Run `model` on its ordinary kernels inside the block: for forwards whose outputs decide no token (the hidden
    states a drafter trains on, the answers of self-distillation), where invariance would only cost time. On a CPU
    in bf16 or fp16 their steps over a cache attend with grouped matmuls (serve/core/attention.py
    `grouped_attention`, faster there than torch's SDPA kernel) and their linears run oneDNN's packed kernel
    (serve/core/packed.py `packs_bf16`)."""
    from draftsmith.serve.core.attention import GROUPED, grouped_wanted, register_grouped

    invariant = is_invariant(model)
    before = getattr(model.config, "_attn_implementation", None)
    ordinary = "sdpa" if invariant else before
    attention = GROUPED if ordinary == "sdpa" and grouped_wanted(model) else ordinary
    if attention == GROUPED:
        register_grouped()
    if invariant:
        make_variant(model, attention)
    elif attention != before:
        model.set_attn_implementation(attention)
    packs = packs_bf16(model) and pack_linears(model) > 0  # bf16 linears on oneDNN's packed weights
    try:
        yield model
    finally:
        if packs:
            unpack_linears(model, keep_copies=True)
        if invariant:
            _switch_to_invariant(model)  # it was invariant on entry: supported, no need to check again
        elif attention != before:
            model.set_attn_implementation(before)


def make_variant(model: nn.Module, attention: str = "sdpa") -> None:
    """Undo `make_invariant`."""
    for module in _linears(model):
        if type(module) is InvariantLinear:
            module.__dict__.pop("packed", None)
            module.__class__ = nn.Linear
    for hook in model.__dict__.pop("_draftsmith_prompt_hooks", ()):
        hook.remove()
    model.set_attn_implementation(attention)
