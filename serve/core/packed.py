"""CPU forwards over several tokens (verification, prefill) through oneDNN's linear on prepacked weights.

A small target's forward on a CPU is bound by reading its weights from memory. `F.linear` calls MKL's sgemm, which
reads each weight matrix once for up to 3 rows but twice or more from 4 rows on: on the default target (fp32, one
thread) verifying 3 drafts (4 tokens) costs 1.70 single-token steps against 1.18 for 2, 5 drafts 1.85 and 8 drafts
2.29. oneDNN's linear over a weight packed once into its blocked layout reads it once for any small row count:
1.41, 1.48 and 1.59 with this module (serve/core/costs.py measures the curve the decoder then plans with). At 2 and 3
rows which kernel is faster depends on the CPU: on that machine they tied, on an AMD EPYC (AVX-512) sgemm took
1.6-1.7x a 1-token step over 2 rows and 2.0-2.1x over 3, packed 1.1x over 2 to 9 rows. On a later EPYC VM oneDNN's
own kernel over 2 rows was slow too (1.2x a 1-row sgemm step) while its 4-row kernel was the fastest of all (0.9x):
there, a forward over 1 to 3 rows runs fastest zero-padded to 4 rows, a plain decoding step included (0.91x).
`tune_small_rows` times the model's own forwards over 1, 2 and 3 tokens on each kernel (sgemm, packed, packed
and padded to 4 rows) when the target is loaded and keeps the fastest per row count, sgemm unless another is
faster by 5% (serve/core/target.py).

The packed copy doubles the memory of the linear weights. `auto` packs a float32 model on the CPU when oneDNN is
there and the copy fits in a quarter of the machine's memory; `on` packs wherever it can, `off` never. Outputs
differ from `F.linear`'s by float rounding only, as any two GEMM kernels do (sgemm's 1-row and 4-row paths differ
from each other too); greedy speculative output stays token-identical to plain decoding in the tests and the demo.

In bfloat16 (`packs_bf16`, `pack_head`) the packed kernel is the faster one at every row count: a bf16 target's
batch-invariant tiles, its `suspended` forwards (self-distillation, capture) and bf16 drafter heads run on it. On an
AVX512-BF16 EPYC it returns F.linear's bits exactly, so answers do not change (docs/results.md, "Data per CPU-hour").
"""
from __future__ import annotations

import os
import statistics
import time
import weakref
from typing import Mapping

import torch
import torch.nn.functional as F
from torch import nn

from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.core.target_config import PACKED_SETTINGS as SETTINGS

# the dtypes oneDNN's packed linear runs: float32 where packing_wanted says, bfloat16 where packs_bf16 does (below)
PACKABLE = (torch.float32, torch.bfloat16)
MIN_ROWS = 4  # rows from which oneDNN's packed linear beats MKL's sgemm (below, sgemm reads the weight once)
# the kernels a forward over fewer rows may run, timed per machine (tune_small_rows): MKL's sgemm (F.linear), oneDNN
# on the packed weight, or oneDNN over the rows zero-padded to MIN_ROWS (its fastest kernel on some CPUs)
KERNELS = ("sgemm", "packed", "padded")

# module -> (the weight's version when packed, the packed weight); kept outside the module, so copying a model
# (deepcopy, state_dict) never copies an opaque oneDNN tensor: a copy packs its own weights on first use
_PACKED: "weakref.WeakKeyDictionary[nn.Module, tuple[int, torch.Tensor]]" = weakref.WeakKeyDictionary()


def onednn_available() -> bool:
    return bool(torch.backends.mkldnn.is_available()) and hasattr(torch.ops.mkldnn, "_linear_pointwise")


class PackedLinear(nn.Linear):
    """An nn.Linear (same parameters, same state dict) whose forward over MIN_ROWS rows or more, without autograd,
    on float32 or bfloat16 CPU tensors of the weight's dtype, runs oneDNN's linear over a packed copy of its weight
    (`packed_linear`). Forwards over fewer rows run the kernel `small` names for that row count (sgemm unless
    tune_small_rows found another faster); anything else runs `F.linear`."""

    small: tuple[str, ...] = ("sgemm",) * (MIN_ROWS - 1)  # the kernel of a forward over 1, 2, 3 rows

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # the common case first and cheap: a decoding step (1 row) on sgemm pays three checks over F.linear
        rows = x.numel() // self.in_features
        kernel = self.small[rows - 1] if 0 < rows < MIN_ROWS else "packed" if rows else "sgemm"
        if kernel == "sgemm" or torch.is_grad_enabled():
            return F.linear(x, self.weight, self.bias)
        if kernel == "packed":
            return packed_linear(self, x)
        flat = x.reshape(rows, self.in_features)  # (rows, in)
        padded = torch.cat([flat, flat.new_zeros(MIN_ROWS - rows, self.in_features)])  # (MIN_ROWS, in)
        return packed_linear(self, padded)[:rows].reshape(*x.shape[:-1], self.out_features)


def packed_linear(module: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """module(x) through oneDNN's linear on a packed copy of module's weight (packed on first use, repacked when the
    weight changes in place), for x (..., in) of the weight's dtype on the CPU without autograd; F.linear otherwise,
    and from then on for this module where this build or CPU cannot run the packed kernel after all."""
    weight = module.weight
    if torch.is_grad_enabled() or x.dtype != weight.dtype or weight.dtype not in PACKABLE \
            or x.device.type != "cpu" or weight.device.type != "cpu" or module.__dict__.get("_unpackable"):
        return F.linear(x, weight, module.bias)
    flat = x.reshape(-1, module.in_features)  # (rows, in)
    try:
        y = torch.ops.mkldnn._linear_pointwise(flat, _packed_weight(module), module.bias, "none", [], "")
    except RuntimeError:
        _PACKED.pop(module, None)
        if type(module) is PackedLinear:
            module.__class__ = nn.Linear
        else:  # an invariant layer keeps its tiles, on F.linear
            module.__dict__["_unpackable"] = True
        return F.linear(x, weight, module.bias)
    return y.reshape(*x.shape[:-1], module.out_features)


def _packed_weight(module: nn.Linear) -> torch.Tensor:
    version = _version(module.weight)
    held = _PACKED.get(module)
    if held is None or held[0] != version:
        held = (version, torch.ops.mkldnn._reorder_linear_weight(module.weight.detach(), None))
        _PACKED[module] = held
    return held[1]


def _version(weight: torch.Tensor) -> int:
    try:
        return int(weight._version)
    except RuntimeError:  # an inference tensor has no version counter; it cannot change in place outside one
        return -1


def linear_weight_bytes(model: nn.Module) -> int:
    seen, total = set(), 0
    for module in model.modules():
        if type(module) is nn.Linear and id(module.weight) not in seen:
            seen.add(id(module.weight))
            total += module.weight.numel() * module.weight.element_size()
    return total


def machine_memory_bytes() -> int | None:
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def packing_wanted(model: nn.Module, setting: str = "auto", dtype: torch.dtype = torch.float32) -> bool:
    """Whether `setting` (auto | on | off) packs the linear layers of `model`, a CPU model in `dtype` (see the
    module docstring)."""
    if setting not in SETTINGS:
        raise DraftsmithError(f"packed weights: choose one of {', '.join(SETTINGS)}, got {setting!r}")
    if setting == "off" or not onednn_available():
        return False
    param = next(model.parameters(), None)
    if param is None or param.device.type != "cpu" or param.dtype != dtype:
        return False
    if setting == "on":
        return True
    memory = machine_memory_bytes()
    return memory is not None and 4 * linear_weight_bytes(model) <= memory


def pack_linears(model: nn.Module) -> int:
    """Turn every plain nn.Linear of `model` into a PackedLinear (in place; weights are packed on first use).
    Returns how many were turned."""
    turned = 0
    for module in model.modules():
        if type(module) is nn.Linear:
            module.__class__ = PackedLinear
            turned += 1
    return turned


def choose_kernels(ratios: Mapping[int, Mapping[str, float]], *, margin: float = 0.05) -> tuple[str, ...]:
    """ratios[rows][kernel] = a forward's time on that kernel over its time on sgemm, for rows 1..MIN_ROWS-1 ->
    the kernel of each row count: the fastest, if it beats sgemm by `margin` (a tie keeps sgemm, the kernel of
    an unpacked model); a row count not timed stays on sgemm."""
    chosen = []
    for rows in range(1, MIN_ROWS):
        timed = {k: r for k, r in ratios.get(rows, {}).items() if k != "sgemm"}
        best = min(timed, key=timed.get, default="sgemm")
        chosen.append(best if best != "sgemm" and timed[best] < 1.0 - margin else "sgemm")
    return tuple(chosen)


def set_small_kernels(model: nn.Module, kernels: tuple[str, ...]) -> None:
    """Every PackedLinear of `model` runs forwards over 1..MIN_ROWS-1 rows on `kernels` (one of KERNELS each)."""
    if len(kernels) != MIN_ROWS - 1 or set(kernels) - set(KERNELS):
        raise ValueError(f"small-row kernels: {MIN_ROWS - 1} of {KERNELS}, got {kernels}")
    for module in model.modules():
        if type(module) is PackedLinear:
            module.small = tuple(kernels)


@torch.inference_mode()
def tune_small_rows(model: nn.Module, *, rounds: int = 4, context_tokens: int = 64) -> tuple[str, ...]:
    """Time `model`'s forwards over 1..MIN_ROWS-1 new tokens on a cached context on every kernel of KERNELS
    (interleaved; each round's times over that round's sgemm time, the median over rounds, as serve/core/costs.py
    times verification), set the kernels choose_kernels picks on every PackedLinear of `model`, and return them.
    ~3 s on the default target; a model without PackedLinear layers is left as it is."""
    from draftsmith.serve.core.costs import context_ids
    from draftsmith.serve.core.kv import cache_kwargs, new_cache, record_states, rollback

    if not any(type(m) is PackedLinear for m in model.modules()):
        return PackedLinear.small
    config = getattr(model.config, "text_config", None) or model.config
    context = context_ids(int(getattr(config, "vocab_size", 2)), context_tokens)  # (1, T)
    cache = new_cache(model)
    model(input_ids=context, logits_to_keep=1, **cache_kwargs(model, cache))
    seconds = {(kernel, rows): [] for kernel in KERNELS for rows in range(1, MIN_ROWS)}
    for r in range(rounds + 1):  # round 0 warms every shape (and packs the weights) up
        for kernel in KERNELS:
            set_small_kernels(model, (kernel,) * (MIN_ROWS - 1))
            for rows in range(1, MIN_ROWS):
                record_states(cache, rows)
                began = time.perf_counter()
                model(input_ids=context[:, :rows], **cache_kwargs(model, cache))
                elapsed = time.perf_counter() - began
                rollback(cache, context_tokens)
                if r > 0:
                    seconds[kernel, rows].append(elapsed)
    ratios = {rows: {kernel: statistics.median(t / base for t, base in zip(seconds[kernel, rows],
                                                                          seconds["sgemm", rows]))
                     for kernel in KERNELS} for rows in range(1, MIN_ROWS)}
    chosen = choose_kernels(ratios)
    set_small_kernels(model, chosen)
    return chosen


def unpack_linears(model: nn.Module, *, keep_copies: bool = False) -> None:
    """Undo `pack_linears`: every PackedLinear back to nn.Linear, its packed copy dropped (kept with `keep_copies`,
    for the next `pack_linears` of the same layers; a weight changed since is repacked then)."""
    for module in model.modules():
        if type(module) is PackedLinear:
            if not keep_copies:
                _PACKED.pop(module, None)
            module.__dict__.pop("small", None)
            module.__class__ = nn.Linear


def remember_setting(model: nn.Module, setting: str) -> None:
    """Keep the target's `packed_weights` setting on its model, for `packs_bf16`."""
    if setting not in SETTINGS:
        raise DraftsmithError(f"packed weights: choose one of {', '.join(SETTINGS)}, got {setting!r}")
    model.__dict__["_draftsmith_packed_weights"] = setting


def packs_bf16(model: nn.Module) -> bool:
    """Whether a bfloat16 CPU model's linears run oneDNN's packed kernel: its batch-invariant tiles while decoding
    (serve/core/invariant.py `InvariantLinear`) and every forward inside `suspended` (self-distillation, capture).
    On the default target (an AVX512-BF16 EPYC) the packed kernel gives F.linear's bits at every row count tried
    (1 to 300) in 0.5-0.8x its time: 1.3-1.5x faster over 16-64 rows at 2 threads, 1.8x over one row, 2.3x for the
    lm_head over 4. The target's `packed_weights` setting decides as `packing_wanted` does for float32 (auto: the
    copy, kept for the model's life, fits in a quarter of the machine's memory). Decided once per setting, dtype
    and device of the model: `suspended` asks twice a decoding step, and the memory check walks every module."""
    setting = model.__dict__.get("_draftsmith_packed_weights", "auto")
    param = next(model.parameters(), None)
    key = (setting, None if param is None else (param.dtype, param.device))
    held = model.__dict__.get("_draftsmith_packs_bf16")
    if held is None or held[0] != key:
        held = model.__dict__["_draftsmith_packs_bf16"] = (key, packing_wanted(model, setting, torch.bfloat16))
    return held[1]


def pack_head(head: nn.Module, target_model: nn.Module) -> bool:
    """A bfloat16 drafter head on the CPU drafts on packed weights at every row count (its linears read F.linear's
    bits in 0.55x its time over one row, 0.75x over 16, on an AVX512-BF16 EPYC), unless the target's packed_weights
    setting is off. Training (autograd) still runs F.linear. Returns whether it packed."""
    param = next(head.parameters(), None)
    if param is None or param.dtype != torch.bfloat16 or param.device.type != "cpu" or not onednn_available() \
            or target_model.__dict__.get("_draftsmith_packed_weights", "auto") == "off":
        return False
    pack_linears(head)
    set_small_kernels(head, ("packed",) * (MIN_ROWS - 1))
    return True

