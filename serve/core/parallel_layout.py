"""How the frozen target is laid out over the processes of a launch (`target.parallel`), as pure functions.

none: every process holds the whole target (data parallel).
tp:   tensor parallelism through transformers' own TP plan over groups of `tp` processes that share a batch
      (mixture-of-experts layers: their experts split over the same group, expert parallelism); the groups
      are data parallel (a dp x tp mesh), each holding one copy, or with `fsdp_size` > 1 FSDP2-sharded over
      `fsdp` groups as well.
fsdp: FSDP2 (`fully_shard` per decoder layer) over `fsdp` processes, each on its own batch; with fewer than
      all processes (one node's, say) the shard groups replicate (HSDP).
A rank's place in transformers' mesh (pp, dp_replicate, fsdp, tp) is row-major: the processes of one TP group
are consecutive ranks, so `torchrun` keeps a group on one node when tp divides the processes per node.
"""
from __future__ import annotations

from dataclasses import dataclass

from draftsmith.serve.core.errors import ConfigError
from draftsmith.serve.core.target_arch import TargetArch
from draftsmith.serve.core.target_config import PARALLEL_KINDS


@dataclass(frozen=True)
class Layout:
    kind: str       # none | tp | fsdp (auto is resolved into one of them)
    world: int      # processes of the launch
    tp: int = 1     # processes of a tensor-parallel group (they share each batch)
    fsdp: int = 1   # processes one copy of the target is FSDP-sharded over
    ep: int = 1     # expert-parallel group (= tp for a mixture of experts under TP)

    @property
    def shards(self) -> int:
        """Ways the target's weights are split: each process holds about 1/shards of them."""
        return self.tp * self.fsdp

    @property
    def replicas(self) -> int:
        """Copies of the (sharded) target over the launch."""
        return self.world // self.shards

    @property
    def data_parallel(self) -> int:
        """Distinct batches a step forwards at once: every process but the TP peers."""
        return self.world // self.tp

    @property
    def sharded(self) -> bool:
        return self.kind != "none" and self.shards > 1

    def describe(self) -> str:
        if not self.sharded:
            return f"none: the whole target on each of {self.world} device(s)" + \
                (" (data parallel)" if self.world > 1 else "")
        parts = []
        if self.tp > 1:
            parts.append(f"tp={self.tp}" + (f" (experts ep={self.ep})" if self.ep > 1 else ""))
        if self.fsdp > 1:
            parts.append(f"fsdp={self.fsdp}")
        if self.replicas > 1:
            parts.append(f"replicas={self.replicas}")
        return f"{self.kind}: {' x '.join(parts)} over {self.world} device(s), each holding 1/{self.shards} " \
               f"of the target"


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def tp_problem(arch: TargetArch, tp: int) -> str | None:
    """Why `tp` processes cannot split this target's layers (None when they can)."""
    if tp == 1:
        return None
    if arch.num_heads % tp:
        return f"tp={tp} does not divide the {arch.num_heads} attention heads"
    if arch.num_kv_heads % tp:  # transformers' colwise k/v projections split whole heads only
        return f"tp={tp} does not divide the {arch.num_kv_heads} key/value heads"
    if arch.is_moe and arch.num_experts % tp:
        return f"tp={tp} does not divide the {arch.num_experts} experts"
    if not arch.is_moe and arch.intermediate_size % tp:
        return f"tp={tp} does not divide the MLP width {arch.intermediate_size}"
    return None


def valid_tp_sizes(arch: TargetArch, limit: int) -> list[int]:
    return [d for d in range(1, limit + 1) if tp_problem(arch, d) is None]


def resolve_layout(kind: str, *, world: int, per_node: int, arch: TargetArch, has_tp_plan: bool = True,
                   tp_size: int = 0, fsdp_size: int = 0) -> Layout:
    """The layout `target.parallel=kind` means for `world` processes (`per_node` on each node); ConfigError in one
    line naming what does not divide, and what would. `auto` is resolved by serve/core/memory_plan.choose_layout."""
    if kind not in PARALLEL_KINDS:
        raise ConfigError(f"target.parallel={kind!r}: choose one of {', '.join(PARALLEL_KINDS)}")
    if kind == "auto":
        raise ConfigError("target.parallel=auto is resolved from a memory plan (memory_plan.choose_layout)")
    if kind == "none" or world == 1:
        if tp_size > 1 or fsdp_size > 1:
            raise ConfigError(f"target.tp_size={tp_size} / target.fsdp_size={fsdp_size} ask for that many processes "
                              f"with target.parallel=tp|fsdp; this launch has {world} with target.parallel={kind}")
        return Layout("none", world)
    if kind == "tp":
        if not has_tp_plan:
            raise ConfigError(f"transformers has no tensor-parallel plan for {arch.model_type!r} targets: use "
                              f"target.parallel=fsdp")
        tp = tp_size or min(world, per_node)
        if world % tp:
            raise ConfigError(f"target.tp_size={tp} does not divide the {world} processes of the launch")
        problem = tp_problem(arch, tp)
        if problem:
            sizes = [d for d in valid_tp_sizes(arch, max(world, per_node, 8)) if d > 1]
            raise ConfigError(f"{problem} of this {arch.model_type} target: the TP sizes that divide it are {sizes} "
                              f"(target.tp_size=N, with a multiple of N processes), or use target.parallel=fsdp")
        fsdp = fsdp_size or 1
        if (world // tp) % fsdp:
            raise ConfigError(f"target.fsdp_size={fsdp} does not divide the {world // tp} TP groups")
        if fsdp > 1:
            tied_problem(arch)
        return Layout("tp", world, tp=tp, fsdp=fsdp, ep=tp if arch.is_moe else 1)
    if tp_size > 1:
        raise ConfigError("target.tp_size is for target.parallel=tp (fsdp shards over target.fsdp_size processes)")
    fsdp = fsdp_size or world
    if world % fsdp:
        raise ConfigError(f"target.fsdp_size={fsdp} does not divide the {world} processes of the launch")
    tied_problem(arch)
    return Layout("fsdp", world, fsdp=fsdp)


def tied_problem(arch: TargetArch) -> None:
    """FSDP2 over a target whose lm_head is its embedding matrix (tie_word_embeddings) leaves the embedding sharded
    in the forward (torch: "aten.embedding got mixed torch.Tensor and DTensor"): refused in one line."""
    if arch.tied_embeddings:
        raise ConfigError(f"target.parallel=fsdp cannot split this {arch.model_type} target: its lm_head shares the "
                          f"embedding matrix (tie_word_embeddings), which FSDP leaves sharded in the forward; use "
                          f"target.parallel=tp (sizes {[d for d in valid_tp_sizes(arch, 8) if d > 1] or 'none'}) "
                          f"or none")
