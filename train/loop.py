"""The training loop: the ONLY module of train/ that touches accelerate, DeepSpeed or torch.distributed.

Runs alone or under `accelerate launch` / `torchrun`: DDP, DeepSpeed ZeRO-2/3 or FSDP as the typed config
says (the DeepSpeed JSON is generated from it). Deterministic data order and per-row noise seeds make a
resumed run (after kill -9) end exactly where an uninterrupted one does on CPU; losses are normalized by
the loss-token count over all processes and micro-batches, so N processes match 1 process.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import resource
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from train import losses
from train.config import TrainConfig
from train.evaluate import BestTracker, agreement_over, sample_rows
from train.objectives import Agreement, FeatureBatch, Objective

CHECKPOINTS = "checkpoints"
STATE_NAME = "trainer_state.json"
BEST_NAME = "best_head.safetensors"  # in a checkpoint: the best head so far, so a resumed run keeps it


@dataclass
class LoopResult:
    state_dict: dict              # the head's trained tensors (CPU), gathered from every shard; main process only
    steps: int
    eval: dict                    # final held-out agreement per position
    is_main: bool
    epochs: float = 0.0           # passes over the training rows (fractional)


# ------------------------------------------------------------------------------------------ accelerate

def resolve_device(config: TrainConfig) -> str:
    return config.target.resolved_device()


def resolve_precision(config: TrainConfig) -> str:
    """bf16 on GPU, fp32 on CPU unless the config says otherwise."""
    if config.distributed.precision != "auto":
        return config.distributed.precision
    return "bf16" if resolve_device(config) == "cuda" else "fp32"


def deepspeed_config(config: TrainConfig) -> dict:
    """The DeepSpeed JSON, generated from our config (never read back for hyper-parameters)."""
    dist, optim = config.distributed, config.optim
    zero: dict = {"stage": dist.zero_stage, "overlap_comm": False, "contiguous_gradients": True}
    if dist.zero_stage == 3:
        zero["stage3_gather_16bit_weights_on_model_save"] = True
    if dist.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": resolve_device(config) == "cuda"}
    return {
        "train_micro_batch_size_per_gpu": optim.batch_size,
        "gradient_accumulation_steps": optim.grad_accum,
        "gradient_clipping": optim.max_grad_norm if optim.max_grad_norm > 0 else 0.0,
        "zero_optimization": zero,
        "bf16": {"enabled": resolve_precision(config) == "bf16"},
        "fp16": {"enabled": False},
        "zero_allow_untested_optimizer": True,  # our torch AdamW, created from our config
        "steps_per_print": 2 ** 31 - 1,
        "wall_clock_breakdown": False,
    }


def make_accelerator(config: TrainConfig):
    from accelerate import Accelerator
    from accelerate.utils import InitProcessGroupKwargs

    device = resolve_device(config)
    dist = config.distributed
    backend = dist.backend if dist.backend != "auto" else ("nccl" if device == "cuda" else "gloo")
    kwargs: dict = {
        # accelerate drops a DeepSpeed plugin under cpu=True; without CUDA it still runs DeepSpeed on CPU (gloo)
        "cpu": device == "cpu" and dist.strategy != "deepspeed",
        "mixed_precision": "bf16" if resolve_precision(config) == "bf16" else "no",
        "gradient_accumulation_steps": config.optim.grad_accum,
        "step_scheduler_with_optimizer": False,  # we step it once per optimizer step, whatever the world size
    }
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        kwargs["kwargs_handlers"] = [InitProcessGroupKwargs(backend=backend)]
    if world > 1 and dist.strategy == "deepspeed":
        from accelerate.utils import DeepSpeedPlugin

        kwargs["deepspeed_plugin"] = DeepSpeedPlugin(hf_ds_config=deepspeed_config(config))
    elif world > 1 and dist.strategy == "fsdp":
        from accelerate.utils import FullyShardedDataParallelPlugin

        kwargs["fsdp_plugin"] = FullyShardedDataParallelPlugin(use_orig_params=True)
    return Accelerator(**kwargs)


def _gathered(accelerator, model):
    """Full parameters for evaluation under ZeRO-3 / FSDP (a no-op otherwise)."""
    from accelerate.utils import DistributedType

    if accelerator.distributed_type == DistributedType.DEEPSPEED and \
            accelerator.state.deepspeed_plugin.zero_stage == 3:
        import deepspeed

        return deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=None)
    if accelerator.distributed_type == DistributedType.FSDP:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        return FSDP.summon_full_params(model, writeback=False)
    return contextlib.nullcontext()


# ------------------------------------------------------------------------------------------- schedule

def lr_lambda(config: TrainConfig, total_steps: int) -> Callable[[int], float]:
    warmup, kind = config.optim.warmup_steps, config.optim.schedule

    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        if kind == "constant":
            return 1.0
        progress = (step - warmup) / max(total_steps - warmup, 1)
        return 0.5 * (1 + math.cos(math.pi * progress)) if kind == "cosine" else max(0.0, 1 - progress)

    return factor


class DataOrder:
    """Global batches of row indices: per-epoch seeded permutations, the remainder of an epoch dropped.

    Step s uses rows stream[s*G:(s+1)*G] (G = batch per process x processes x grad_accum); micro-batch a of
    process r takes the slice ((a*world + r)*b, +b). Resuming at step s needs nothing but s.
    """

    def __init__(self, train_rows: list[int], *, seed: int, global_batch: int):
        self.rows, self.seed, self.global_batch = train_rows, seed, global_batch
        self.steps_per_epoch = len(train_rows) // global_batch
        self._epoch, self._perm = -1, []

    def batch(self, step: int) -> list[tuple[int, int]]:
        """[(stream position, row index)] of global step `step`."""
        epoch, within = divmod(step, self.steps_per_epoch)
        if epoch != self._epoch:
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch + 1)
            self._perm = [self.rows[i] for i in torch.randperm(len(self.rows), generator=gen).tolist()]
            self._epoch = epoch
        start = within * self.global_batch
        return [(step * self.global_batch + i, self._perm[start + i]) for i in range(self.global_batch)]


# ----------------------------------------------------------------------------------------- checkpoints

def latest_checkpoint(out_dir: Path) -> Path | None:
    done = sorted(p for p in (out_dir / CHECKPOINTS).glob("step_*")
                  if p.suffix != ".tmp" and (p / STATE_NAME).is_file())
    return done[-1] if done else None


def save_checkpoint(accelerator, out_dir: Path, step: int, keep: int, extra: dict,
                    files: dict[str, dict] | None = None) -> None:
    """accelerate's save_state (model, optimizer, scheduler, RNG) into a temp folder, renamed when complete,
    so a kill -9 mid-save leaves the previous checkpoint intact. files: name -> tensors saved beside it."""
    root = out_dir / CHECKPOINTS
    final, tmp = root / f"step_{step:08d}", root / f"step_{step:08d}.tmp"
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        from safetensors.torch import save_file

        for name, tensors in (files or {}).items():
            save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp / name))
        (tmp / STATE_NAME).write_text(json.dumps({"step": step, **extra}))
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        for old in sorted(p for p in root.glob("step_*") if p.suffix != ".tmp")[:-max(keep, 1)]:
            shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20  # Linux reports KiB


# ------------------------------------------------------------------------------------------------ loop

def _head_state(accelerator, model) -> dict:
    """The head's tensors (CPU) gathered from every shard; call on every process, use on the main one."""
    state = accelerator.get_state_dict(model)
    if not accelerator.is_main_process:
        return {}
    return {k[len("head."):]: v.detach().cpu() for k, v in state.items() if k.startswith("head.")}


def _reduced(accelerator, agreement: Agreement) -> Agreement:
    return Agreement.from_tensor(accelerator.reduce(agreement.as_tensor().to(accelerator.device),
                                                    reduction="sum").cpu())


def train_loop(config: TrainConfig, *, objective: Objective, rows, train_idx: list[int], eval_idx: list[int],
               make_batch: Callable[[list[dict]], tuple[FeatureBatch, float]], out_dir: Path,
               tracker_factory: Callable[..., object], eval_positions: int, eval_rows=None) -> LoopResult:
    """Train `objective.head`. make_batch(rows) -> (FeatureBatch on the device, seconds spent in the target).

    eval_rows: where `eval_idx` points (a held-out dataset or cache of its own); default the training rows.
    With log.eval_every, every evaluation logs held-out and train agreement; optim.keep_best returns the head of
    the best held-out evaluation, optim.early_stop_patience stops after that many evaluations without progress.
    """
    from accelerate.utils import set_seed
    from safetensors.torch import load_file

    accelerator = make_accelerator(config)
    set_seed(config.seed)
    world, rank = accelerator.num_processes, accelerator.process_index
    optim = config.optim
    global_batch = optim.batch_size * world * optim.grad_accum
    order = DataOrder(train_idx, seed=config.seed, global_batch=global_batch)
    if order.steps_per_epoch == 0:
        from serve.errors import DraftsmithError

        raise DraftsmithError(f"{len(train_idx)} training rows are fewer than one global batch ({global_batch} = "
                              f"batch_size x processes x grad_accum)")
    total_steps = optim.max_steps or optim.epochs * order.steps_per_epoch

    weights = objective.term_weights()
    params = [p for p in objective.parameters() if p.requires_grad]
    # fused: one kernel over every parameter instead of a python loop of small ops (7% of a CPU step at batch 2)
    optimizer = torch.optim.AdamW(params, lr=optim.lr, betas=(optim.beta1, optim.beta2),
                                  weight_decay=optim.weight_decay, fused=True)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(config, total_steps))
    model, optimizer = accelerator.prepare(objective, optimizer)
    accelerator.register_for_checkpointing(scheduler)

    periodic = bool(eval_idx) and config.log.eval_every > 0
    best = BestTracker(patience=optim.early_stop_patience if periodic else 0)
    start_step = 0
    ckpt = latest_checkpoint(out_dir) if config.checkpoint.resume else None
    if ckpt is not None:
        accelerator.load_state(str(ckpt))
        saved = json.loads((ckpt / STATE_NAME).read_text())
        start_step = saved["step"]
        if "best" in saved and (ckpt / BEST_NAME).is_file():
            best.best_score, best.best_step, best.stale = (saved["best"][k] for k in ("best_score", "best_step",
                                                                                      "stale"))
            best.best_state = load_file(str(ckpt / BEST_NAME))
    tracker = tracker_factory(enabled=accelerator.is_main_process, total_steps=total_steps, start_step=start_step)
    tracker.log({"event": "start", "processes": world, "distributed_type": str(accelerator.distributed_type),
                 "precision": resolve_precision(config), "total_steps": total_steps, "global_batch": global_batch},
                step=start_step)
    if ckpt is not None:
        tracker.log({"event": "resumed", "checkpoint": str(ckpt)}, step=start_step)

    unwrapped = accelerator.unwrap_model(model)
    held_out_rows = rows if eval_rows is None else eval_rows
    train_probe = sample_rows(train_idx, min(len(eval_idx), config.log.train_eval_rows), seed=config.seed)

    def evaluate() -> dict:
        model.eval()
        with _gathered(accelerator, model):
            held = agreement_over(unwrapped, held_out_rows, eval_idx[rank::world], make_batch, eval_positions)
            seen = agreement_over(unwrapped, rows, train_probe[rank::world], make_batch, eval_positions)
        model.train()
        record = _reduced(accelerator, held).summary()
        if train_probe:
            train = _reduced(accelerator, seen).summary()
            record.update({"train_agreement": train["agreement"], "train_mu_tf": train["mu_tf"]})
        return record

    def checkpoint(done: int) -> None:
        extra = {"total_steps": total_steps}
        if best.best_state is not None:
            extra["best"] = best.to_json()
        save_checkpoint(accelerator, out_dir, done, config.checkpoint.keep, extra,
                        files={BEST_NAME: best.best_state} if best.best_state is not None else {})

    if start_step == 0 and eval_idx:
        tracker.log({"event": "eval", **evaluate(), "trained": False}, step=0)

    model.train()
    window = {"tokens": 0, "seconds": 0.0, "target_seconds": 0.0, "steps": 0, "cpu_seconds": 0.0}
    term_sums: dict[str, float] = {}
    term_counts: dict[str, float] = {}
    run_start, steps_done = time.time(), 0
    last_eval: dict = {}
    stopped_at = total_steps
    for step in range(start_step, total_steps):
        t0, cpu0 = time.time(), time.process_time()
        stream = order.batch(step)
        b = optim.batch_size
        micro = [stream[(a * world + rank) * b:(a * world + rank + 1) * b] for a in range(optim.grad_accum)]
        batches, target_seconds, tokens = [], 0.0, 0
        for part in micro:
            batch, seconds = make_batch([rows[i] for _, i in part])
            seeds = torch.tensor([config.seed * 1_000_003 + pos for pos, _ in part], dtype=torch.long)
            batches.append((batch, seeds))
            target_seconds += seconds
            tokens += int(batch.attention_mask.sum())
        counts = {}
        for batch, _ in batches:
            for name, value in unwrapped.term_counts(batch).items():
                counts[name] = counts.get(name, 0) + value.float()
        names = sorted(counts)
        reduced = accelerator.reduce(torch.stack([counts[n] for n in names]).to(accelerator.device), reduction="sum")
        global_counts = dict(zip(names, reduced.tolist()))
        for batch, seeds in batches:
            with accelerator.accumulate(model):
                sums = model(batch.input_ids, batch.loss_mask, batch.hidden_states, batch.attention_mask, seeds,
                             batch.target_top1)
                # accelerate / DeepSpeed divide by grad_accum and DDP averages over processes: undo both so
                # the gradient is that of the global per-token mean
                loss = losses.normalize(sums, global_counts, weights, scale=world * optim.grad_accum)
                accelerator.backward(loss)
                if accelerator.sync_gradients and optim.max_grad_norm > 0:
                    accelerator.clip_grad_norm_(model.parameters(), optim.max_grad_norm)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            for name, value in sums.items():
                term_sums[name] = term_sums.get(name, 0.0) + float(value.detach())
        for name in names:
            term_counts[name] = term_counts.get(name, 0.0) + global_counts[name] / world
        scheduler.step()
        steps_done += 1
        done = step + 1
        window["tokens"] += tokens * world
        window["seconds"] += time.time() - t0
        window["target_seconds"] += target_seconds
        window["cpu_seconds"] += time.process_time() - cpu0
        window["steps"] += 1
        tracker.advance()

        if done % max(config.log.every, 1) == 0 or done == total_steps:
            # local sums over local share of counts: per-token means, approximately global on N processes
            terms = {n: term_sums.get(n, 0.0) / max(term_counts.get(n, 0.0), 1.0) for n in names}
            per_step = (time.time() - run_start) / steps_done
            record = {"loss": sum(weights[n] * terms[n] for n in names), **{f"loss/{n}": v for n, v in terms.items()},
                      "lr": scheduler.get_last_lr()[0], "tokens": window["tokens"],
                      "tokens_per_s": window["tokens"] / max(window["seconds"], 1e-9),
                      "step_seconds": window["seconds"] / window["steps"],
                      # CPU time of this process: a throughput that a busy shared machine does not distort
                      "tokens_per_cpu_s": window["tokens"] / world / max(window["cpu_seconds"], 1e-9),
                      "target_share": window["target_seconds"] / max(window["seconds"], 1e-9),
                      "eta_seconds": per_step * (total_steps - done), "peak_rss_gib": round(peak_rss_gib(), 3),
                      "epoch": step // order.steps_per_epoch, "processes": world}
            tracker.log(record, step=done)
            window = {"tokens": 0, "seconds": 0.0, "target_seconds": 0.0, "steps": 0, "cpu_seconds": 0.0}
            term_sums, term_counts = {}, {}
        if periodic and (done % config.log.eval_every == 0 or done == total_steps):
            last_eval = evaluate()
            improved = best.update(last_eval["mu_tf"], done, lambda: _head_state(accelerator, model))
            tracker.log({"event": "eval", **last_eval, "trained": True, "best": improved,
                         "final": done == total_steps}, step=done)
            if best.should_stop:
                tracker.log({"event": "early_stop", **best.to_json()}, step=done)
                stopped_at = done
                break
        if config.checkpoint.every and done % config.checkpoint.every == 0 and done != total_steps:
            checkpoint(done)

    if eval_idx and not periodic:
        last_eval = evaluate()
        tracker.log({"event": "eval", **last_eval, "trained": True, "final": True}, step=total_steps)
    accelerator.wait_for_everyone()
    head_state = _head_state(accelerator, model)
    result_eval = last_eval
    if optim.keep_best and best.best_state is not None:
        head_state = best.best_state if accelerator.is_main_process else {}
        result_eval = {**last_eval, "best": best.to_json()}
        tracker.log({"event": "kept_best", **best.to_json()}, step=stopped_at)
    tracker.close()
    accelerator.wait_for_everyone()
    accelerator.end_training()
    return LoopResult(state_dict=head_state, steps=stopped_at, eval=result_eval,
                      is_main=accelerator.is_main_process, epochs=stopped_at / order.steps_per_epoch)
