"""A frozen target split over the processes of a launch, and forwards that every process runs in lock-step.

Loading: transformers' own distributed engine (`from_pretrained(..., distributed_config=DistributedConfig(...))`)
builds the model on the meta device, applies its TP plan (DTensor) or FSDP2 (`fully_shard` per decoder layer),
then reads each rank's shard of every tensor straight from the safetensors files: no process holds the whole
model. FSDP keeps nothing whole after a forward (the frozen target has no backward to keep it for).

Forwards: a sharded forward is a collective, so every process must run the same number of them, in the same
order, whatever its own share of the work. Each lock-step forward first all-gathers every process's batch shape;
the processes of a TP group (which must feed identical inputs) then gather one another's rows, forward them
together and keep their own; under FSDP each forwards its own rows. A process without rows forwards one padding
token, and `drain` keeps a finished process in step until every process has finished.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import torch

from draftsmith.serve.core.layers import FINAL, hidden_states_at
from draftsmith.serve.core.parallel_layout import Layout

ARGMAX_CHUNK = 1024  # tokens per lm_head product of `top1`: (chunk, V) logits at a time


def _free_after_forward_plan(config: Any) -> dict[str, str]:
    """FSDP plan overrides that reshard every module after its forward: transformers keeps the final norm and the
    lm_head whole (`keep_full_weight`), which saves a re-gather in training a model, not in forwarding a frozen one."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    model_class = MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    plan = dict(getattr(model_class, "_fsdp_plan", None) or {})
    prefix = model_class.base_model_prefix
    plan.update({f"{prefix}.{name}": style for name, style in (getattr(config, "base_model_fsdp_plan", None) or {}).items()})
    return {name: "free_full_weight" for name, style in plan.items() if style == "keep_full_weight"}


def distributed_config(layout: Layout, config: Any):
    """transformers' DistributedConfig for `layout` (the mesh (dp_replicate, fsdp, tp) it spans)."""
    from transformers.distributed import DistributedConfig

    fsdp_plan = _free_after_forward_plan(config) if layout.replicas * layout.fsdp > 1 else None
    if layout.kind == "tp":
        return DistributedConfig(tp_size=layout.tp, fsdp_size=layout.fsdp, dp_replicate_size=layout.replicas,
                                 ep_size=layout.ep if layout.ep > 1 else None, fsdp_plan=fsdp_plan)
    return DistributedConfig(fsdp_size=layout.fsdp, dp_replicate_size=layout.replicas, fsdp_plan=fsdp_plan)


def is_sharded_tensor(tensor: Any) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(tensor, DTensor)


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """A whole local copy of a (possibly sharded) parameter. Collective for a sharded one: every process calls it,
    in the same order."""
    if is_sharded_tensor(tensor):
        return tensor.full_tensor().detach()
    return tensor.detach()


def local_parameter_bytes(model: torch.nn.Module) -> int:
    """Bytes of the parameters this process holds (its shards; a tied tensor once)."""
    seen, total = set(), 0
    for param in model.parameters():
        if id(param) in seen:
            continue
        seen.add(id(param))
        local = param.to_local() if is_sharded_tensor(param) else param
        total += local.numel() * local.element_size()
    return total


class ShardedForward:
    """Lock-step forwards of a sharded target's decoder (and, with `top1`, its lm_head's argmax)."""

    def __init__(self, model: Any, layout: Layout, *, rank: int, device: torch.device, comm_device: torch.device,
                 top1: bool = False):
        self.model, self.layout, self.rank, self.device, self.comm_device = model, layout, rank, device, comm_device
        self.top1 = top1
        first = rank - rank % layout.tp
        self.peers = list(range(first, first + layout.tp))  # this process's TP group (consecutive ranks)

    def _gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        import torch.distributed as dist

        tensor = tensor.to(self.comm_device)
        out = [torch.empty_like(tensor) for _ in range(self.layout.world)]
        dist.all_gather(out, tensor)
        return [t.cpu() for t in out]

    def _group_batch(self, shapes: torch.Tensor, input_ids, attention_mask):
        """The rows this process's TP group forwards together: (input_ids, attention_mask, {peer: its first row});
        (None, None, ...) when the group has none. Under TP every process gathers (the gather is a collective of
        the whole launch), under FSDP none does."""
        if self.layout.tp == 1:
            return input_ids, attention_mask, {self.rank: 0}
        starts, total = {}, 0
        for r in self.peers:
            starts[r] = total
            total += int(shapes[r, 0])
        rows, width = int(shapes[:, 0].max()), int(shapes[:, 1].max())
        padded_ids = torch.zeros(rows, width, dtype=torch.long)
        padded_mask = torch.zeros(rows, width, dtype=torch.long)
        if input_ids is not None:
            b, t = input_ids.shape
            padded_ids[:b, :t], padded_mask[:b, :t] = input_ids.cpu(), attention_mask.cpu()
        all_ids, all_masks = self._gather(padded_ids), self._gather(padded_mask)
        if total == 0:
            return None, None, starts
        group_width = max(int(shapes[r, 1]) for r in self.peers)
        ids = torch.cat([all_ids[r][:int(shapes[r, 0]), :group_width] for r in self.peers]).cpu()
        mask = torch.cat([all_masks[r][:int(shapes[r, 0]), :group_width] for r in self.peers]).cpu()
        return ids, mask, starts  # (the group's rows, group_width) each

    def _chunks(self, shapes: torch.Tensor) -> int:
        """lm_head products per forward, the same on every process: the most any group needs."""
        groups = [range(g, g + self.layout.tp) for g in range(0, self.layout.world, self.layout.tp)]
        tokens = [max(sum(int(shapes[r, 0]) for r in g) * max(int(shapes[r, 1]) for r in g), 1) for g in groups]
        return max(math.ceil(n / ARGMAX_CHUNK) for n in tokens)

    @torch.no_grad()
    def _step(self, input_ids, attention_mask, layer_ids: Sequence[int], *, done: bool):
        b, t = (0, 0) if input_ids is None else tuple(input_ids.shape)
        shapes = torch.stack(self._gather(torch.tensor([b, t, int(done)], dtype=torch.long))).cpu()  # (world, 3)
        if bool(shapes[:, 2].all()):
            return None
        ids, mask, starts = self._group_batch(shapes, input_ids, attention_mask)
        if ids is None:  # this group has no rows while others do: one padding token keeps it in step
            ids = torch.zeros(1, 1, dtype=torch.long, device=self.device)
            mask = torch.ones_like(ids)
        wanted = list(dict.fromkeys([*layer_ids, FINAL])) if self.top1 else list(layer_ids)
        picked = hidden_states_at(self.model.get_decoder(), wanted, input_ids=ids.to(self.device),
                                  attention_mask=mask.to(self.device))  # {id: (rows, width, h)}
        top1 = None
        if self.top1:
            final = picked[FINAL]
            flat = final.reshape(-1, final.shape[-1])  # (rows * width, h)
            head = self.model.get_output_embeddings()
            parts = []
            for c in range(self._chunks(shapes)):
                chunk = flat[c * ARGMAX_CHUNK:(c + 1) * ARGMAX_CHUNK]
                logits = head(chunk if chunk.shape[0] else flat[:1])
                if chunk.shape[0]:
                    parts.append(logits.argmax(-1))
            top1 = torch.cat(parts).view(final.shape[:2])  # (rows, width)
        if input_ids is None:
            return {}
        first = starts[self.rank]
        mine = {i: picked[i][first:first + b, :t] for i in layer_ids}
        return mine, (None if top1 is None else top1[first:first + b, :t])

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                layer_ids: Sequence[int]) -> tuple[dict[int, torch.Tensor], torch.Tensor | None]:
        """({layer id: (B, T, h)}, (B, T) the target's argmax or None) of this process's right-padded rows
        (B >= 1)."""
        if input_ids.shape[0] == 0 or input_ids.shape[1] == 0:
            raise ValueError("a lock-step forward needs at least one row and one token; call drain() when done")
        return self._step(input_ids, attention_mask, layer_ids, done=False)

    def drain(self) -> None:
        """Stay in step with the processes still forwarding until every process has called drain."""
        while self._step(None, None, (), done=True) is not None:
            pass


def load_sharded_model(path: str, *, dtype: torch.dtype, layout: Layout, config: Any, **kwargs: Any) -> Any:
    """The model of `path`, split as `layout` says by transformers while it loads (each rank reads its shards)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, distributed_config=distributed_config(layout, config),
                                                **kwargs)
