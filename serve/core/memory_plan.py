"""The memory one device needs for a capture or a training run, before any work, as pure functions of the target's
config (serve/core/target_arch.py), the layout (serve/core/parallel_layout.py) and the workload.

Per device: the target's shard, FSDP's all-gathered units, the target's activations (a whole target's forward
with `output_hidden_states` keeps every layer's output, a split one only the stored layers'; a TP group forwards
its processes' rows together), and for training the head (fp32), its gradients and AdamW states, the full
embeddings and lm_head the head trains against when the target itself is sharded, and the head's activations. Activations are estimates (bytes per token, written
below), the weights exact up to norms and biases. One shard of the hidden-state cache lives in host memory during a
capture and is reported apart. A plan fits when its total stays within USABLE of the device.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

from draftsmith.serve.core.errors import ConfigError
from draftsmith.serve.core.parallel_layout import Layout, divisors, resolve_layout, tp_problem
from draftsmith.serve.core.target_arch import TargetArch, arch_of, dtype_bytes
from draftsmith.serve.core.target_config import TargetConfig

GIB = 1 << 30
USABLE = 0.9  # of a device's memory: the CUDA context, NCCL buffers and the allocator's fragmentation take the rest
ARGMAX_CHUNK = 1024  # tokens per lm_head product when the capture stores the target's top-1


@dataclass(frozen=True)
class Workload:
    task: str                  # capture | train
    dtype: str                 # the target's compute dtype
    tokens: int                # tokens one process forwards at once (capture: batch_tokens; train: batch x length)
    stored_layers: int         # hidden states kept per token (aux layers + the final one)
    online: bool = True        # train: the target runs inside the step (offline: features come from the cache)
    head_params: int = 0       # train: trainable parameters of the head
    head_vocab: int = 0        # train: columns of the head's softmax (the draft vocabulary)
    head_intermediate: int = 0 # train: MLP width of the draft layer (0 for Medusa)
    unroll: float = 1          # train: head forwards per position kept for backward (EAGLE-3 TTT steps, Medusa
                               # heads, DFlash's blocks over a row)
    cache_dtype: str = "bf16"  # capture: the cache's dtype
    shard_tokens: int = 0      # capture: tokens of one shard, built in host memory
    split_over_tp: bool = False  # capture: a TP group's processes split `tokens` (each plans tokens / tp)

    def __post_init__(self):
        if self.task not in ("capture", "train"):
            raise ConfigError(f"unknown workload {self.task!r}: capture | train")


@dataclass
class MemoryPlan:
    layout: Layout
    device_bytes: int
    lines: list[tuple[str, int, str]] = field(default_factory=list)  # (what, bytes per device, how it was counted)
    host_lines: list[tuple[str, int, str]] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(b for _, b, _ in self.lines)

    @property
    def usable(self) -> int:
        return int(self.device_bytes * USABLE)

    @property
    def fits(self) -> bool:
        return self.total <= self.usable

    def largest(self) -> tuple[str, int, str]:
        return max(self.lines, key=lambda line: line[1])


def _target_lines(arch: TargetArch, layout: Layout, work: Workload) -> list[tuple[str, int, str]]:
    b = dtype_bytes(work.dtype)
    h = arch.hidden_size
    lines = [("target weights", math.ceil(arch.total_params * b / layout.shards),
              f"{arch.params_b():.2f}B params x {b} B / {layout.shards}")]
    if layout.sharded and layout.fsdp > 1:
        unit = max(arch.layer_params, arch.embedding_params)
        lines.append(("fsdp all-gather", 2 * unit * b // layout.tp,
                      "two units whole at once (a decoder layer or the embeddings; prefetch)"))
    tokens = work.tokens if work.split_over_tp or not layout.sharded else work.tokens * layout.tp
    mlp = arch.experts_per_token * arch.expert_intermediate_size if arch.is_moe else arch.intermediate_size
    # whole: output_hidden_states holds all n + 1 states; split: hooks keep the stored ones (hidden_states_at)
    states = work.stored_layers + 1 if layout.sharded else arch.num_layers + 1
    # + one layer's transient work: q, k, v, attention output, residual and norm (~6 h), gate, up and their product
    per_token = states * h + 6 * h + 3 * mlp // max(layout.tp, 1)
    note = f"{tokens} tokens x ({states} hidden states + one layer's work) x {b} B"
    if layout.sharded and layout.tp > 1 and not work.split_over_tp:
        note += f"; the {layout.tp} TP peers' rows forward together"
    lines.append(("target activations", tokens * per_token * b, note))
    if work.task == "capture":
        lines.append(("top-1 logits", ARGMAX_CHUNK * arch.vocab_size * 4 // max(layout.tp, 1),
                      f"{ARGMAX_CHUNK}-token chunks x vocabulary x fp32"))
    return lines


def _train_lines(arch: TargetArch, layout: Layout, work: Workload) -> list[tuple[str, int, str]]:
    b = dtype_bytes(work.dtype)
    h = arch.hidden_size
    lines = [("head weights", work.head_params * 4, f"{work.head_params / 1e6:.1f}M params x fp32"),
             ("head gradients + AdamW", work.head_params * 12, "fp32 gradient + two moments per param")]
    if layout.sharded or not work.online:
        heads = 1 if arch.tied_embeddings else 2
        lines.append(("frozen embeddings + lm_head", heads * arch.embedding_params * b,
                      "whole copies the head reads (its input embeddings, the target's distribution)"))
    vocab = work.head_vocab or arch.vocab_size
    # per token and unrolled step, kept for backward in fp32: logits, log-softmax and target probabilities over the
    # draft vocabulary, and the draft layer's inputs and intermediates (~10 h + 3 MLP widths)
    per_step = vocab * 4 * 3 + (10 * h + 3 * work.head_intermediate) * 4
    lines.append(("head activations", work.tokens * (work.unroll * per_step + arch.vocab_size * 4),
                  f"{work.tokens} tokens x ({work.unroll:g} unrolled steps x (softmax + layer) + target logits)"))
    if not work.online:
        lines.append(("cached features", work.tokens * work.stored_layers * h * 4,
                      f"{work.stored_layers} stored states per token, fp32 on the device"))
    return lines


def plan_memory(arch: TargetArch, layout: Layout, work: Workload, *, device_gib: float) -> MemoryPlan:
    """What one device of `layout` holds for `work` on this target."""
    plan = MemoryPlan(layout=layout, device_bytes=int(device_gib * GIB))
    if work.task == "capture" or work.online:
        plan.lines += _target_lines(arch, layout, work)
    if work.task == "train":
        plan.lines += _train_lines(arch, layout, work)
    else:
        cache = work.shard_tokens * work.stored_layers * arch.hidden_size * dtype_bytes(work.cache_dtype)
        plan.host_lines.append(("cache shard (host memory)", cache,
                                f"{work.shard_tokens} tokens x {work.stored_layers} states x {work.cache_dtype}"))
    return plan


def candidate_layouts(arch: TargetArch, *, world: int, per_node: int, has_tp_plan: bool) -> list[Layout]:
    """Every layout of `world` processes, most preferred first: the whole target, TP within a node (the rest data
    parallel, then also FSDP-sharded), FSDP over shard groups from small to the whole launch."""
    found = [Layout("none", world)]
    tps = [t for t in divisors(min(world, per_node)) if t > 1 and world % t == 0 and tp_problem(arch, t) is None] \
        if has_tp_plan else []
    found += [Layout("tp", world, tp=t, ep=t if arch.is_moe else 1) for t in tps]
    found += [Layout("fsdp", world, fsdp=f) for f in divisors(world) if f > 1]
    found += [Layout("tp", world, tp=t, fsdp=f, ep=t if arch.is_moe else 1)
              for t in tps for f in divisors(world // t) if f > 1]
    return found


def choose_layout(arch: TargetArch, work: Workload, *, world: int, per_node: int, device_gib: float,
                  has_tp_plan: bool) -> MemoryPlan:
    """`target.parallel=auto`: the first layout of candidate_layouts that fits; ConfigError (from refuse) when none
    does with these processes."""
    plans = [plan_memory(arch, layout, work, device_gib=device_gib)
             for layout in candidate_layouts(arch, world=world, per_node=per_node, has_tp_plan=has_tp_plan)]
    for plan in plans:
        if plan.fits:
            return plan
    refuse(min(plans, key=lambda p: p.total), arch, work, per_node=per_node, has_tp_plan=has_tp_plan)
    raise AssertionError("unreachable")


def smallest_fitting(arch: TargetArch, work: Workload, *, per_node: int, device_gib: float, has_tp_plan: bool,
                     max_devices: int = 1024) -> MemoryPlan | None:
    """The plan of the fewest devices (powers of two, whole nodes beyond one) on which some layout fits."""
    counts = sorted({n for n in (2 ** k for k in range(11)) if n <= max_devices and (n <= per_node or n % per_node == 0)})
    for n in counts:
        for layout in candidate_layouts(arch, world=n, per_node=min(n, per_node), has_tp_plan=has_tp_plan):
            if layout.kind == "none" and n > 1:
                continue  # the same per device as one device
            plan = plan_memory(arch, layout, work, device_gib=device_gib)
            if plan.fits:
                return plan
    return None


def launch_hint(layout: Layout) -> str:
    """The overrides that ask for `layout`."""
    if not layout.sharded:
        return "target.parallel=none"
    if layout.kind == "tp":
        extra = f" target.fsdp_size={layout.fsdp}" if layout.fsdp > 1 else ""
        return f"target.parallel=tp target.tp_size={layout.tp}{extra}"
    extra = f" target.fsdp_size={layout.fsdp}" if layout.fsdp != layout.world else ""
    return f"target.parallel=fsdp{extra}"


def refusal(plan: MemoryPlan, arch: TargetArch, work: Workload, *, per_node: int, has_tp_plan: bool) -> str | None:
    """One line: why `plan` does not fit, and the smallest layout that would; None when it fits."""
    if plan.fits:
        return None
    what, size, _ = plan.largest()
    gib = plan.device_bytes / GIB
    smallest = smallest_fitting(arch, work, per_node=per_node, device_gib=gib, has_tp_plan=has_tp_plan)
    if smallest is None:
        hint = "no layout up to 1024 devices fits: lower the batch (tokens per forward) or the sequence length"
    else:
        hint = (f"the smallest layout that fits is {smallest.layout.describe()} ({smallest.total / GIB:.1f} GiB per "
                f"device): launch {smallest.layout.world} processes with {launch_hint(smallest.layout)}")
    return (f"{plan.layout.describe().split(':')[0]} on {plan.layout.world} device(s) of {gib:.0f} GiB does not "
            f"fit: {plan.total / GIB:.1f} GiB per device > {plan.usable / GIB:.1f} GiB usable ({what} alone "
            f"{size / GIB:.1f} GiB); {hint}")


def refuse(plan: MemoryPlan, arch: TargetArch, work: Workload, *, per_node: int, has_tp_plan: bool) -> None:
    """ConfigError with refusal's line when `plan` does not fit."""
    message = refusal(plan, arch, work, per_node=per_node, has_tp_plan=has_tp_plan)
    if message:
        raise ConfigError(message)


def format_plan(plan: MemoryPlan, *, title: str) -> str:
    """The plan as a table: one line per part, the total against the device, and the layout."""
    rows = [title, f"layout: {plan.layout.describe()}"]
    width = max(len(name) for name, _, _ in plan.lines + plan.host_lines)
    for name, size, note in plan.lines:
        rows.append(f"  {name:<{width}}  {size / GIB:9.2f} GiB  {note}")
    verdict = "fits" if plan.fits else "DOES NOT FIT"
    rows.append(f"  {'total per device':<{width}}  {plan.total / GIB:9.2f} GiB  of {plan.usable / GIB:.1f} GiB usable "
                f"({USABLE:.0%} of {plan.device_bytes / GIB:.0f} GiB): {verdict}")
    for name, size, note in plan.host_lines:
        rows.append(f"  {name:<{width}}  {size / GIB:9.2f} GiB  {note}")
    return "\n".join(rows)


def plan_layout(kind: str, arch: TargetArch, work: Workload, *, world: int, per_node: int, device_gib: float,
                has_tp_plan: bool, tp_size: int = 0, fsdp_size: int = 0, enforce: bool = True) -> MemoryPlan:
    """The plan of `target.parallel=kind` on `world` processes: auto picks the first layout that fits; with
    `enforce` a layout that does not fit is refused (ConfigError naming the smallest one that would)."""
    if kind == "auto" and not (tp_size or fsdp_size):
        return choose_layout(arch, work, world=world, per_node=per_node, device_gib=device_gib,
                             has_tp_plan=has_tp_plan)
    kind = "fsdp" if kind == "auto" and not tp_size else ("tp" if kind == "auto" else kind)
    layout = resolve_layout(kind, world=world, per_node=per_node, arch=arch, has_tp_plan=has_tp_plan,
                            tp_size=tp_size, fsdp_size=fsdp_size)
    plan = plan_memory(arch, layout, work, device_gib=device_gib)
    if enforce and not plan.fits:
        refuse(plan, arch, work, per_node=per_node, has_tp_plan=has_tp_plan)
    return plan


def plan_report(section: TargetConfig, hf_config: Any, work: Workload, *, devices: int, per_node: int, device_gib: float,
                title: Callable[[TargetArch], str]) -> tuple[MemoryPlan, str, str | None]:
    """`--plan` of `work` on a target of `hf_config` split as the recipe's `target` section (`section`) says (parallel, tp_size,
    fsdp_size), on `devices` devices of `device_gib` GiB, `per_node` on each node: (the plan, its table titled
    `title(arch)`, None or the one-line refusal naming the smallest layout that fits)."""
    arch = arch_of(hf_config)
    has_tp_plan = bool(getattr(hf_config, "base_model_tp_plan", None))
    plan = plan_layout(section.parallel, arch, work, world=devices, per_node=per_node, device_gib=device_gib,
                       has_tp_plan=has_tp_plan, tp_size=section.tp_size, fsdp_size=section.fsdp_size, enforce=False)
    return plan, format_plan(plan, title=title(arch)), refusal(plan, arch, work, per_node=per_node,
                                                                has_tp_plan=has_tp_plan)
