"""The training loop: the ONLY module of train/ that touches accelerate, DeepSpeed or torch.distributed.

Runs alone or under `accelerate launch` / `torchrun`: DDP, DeepSpeed ZeRO-2/3 or FSDP as the typed config
says (the DeepSpeed JSON is generated from it). Deterministic data order and per-row noise seeds make a
resumed run (after kill -9) end exactly where an uninterrupted one does on CPU; losses are normalized by
the loss-token count over all processes and micro-batches, so N processes match 1 process.
"""
from __future__ import annotations

import contextlib
import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from draftsmith.serve.core.process_group import launch
from draftsmith.serve.methods import losses
from draftsmith.train.config import TrainConfig, precision_on
from draftsmith.train.evaluate import BestTracker, agreement_over, sample_rows
from draftsmith.train.metrics import MetricWindow, StepStats
from draftsmith.serve.methods.objective import Agreement, FeatureBatch, Objective
from draftsmith.train.preflight import check_rows_fill_a_batch
from draftsmith.train.schedule import CALIBRATION_STEPS, REFIT_EVERY, Cadence, DataOrder, lr_lambda, steps_within

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
    """The compute precision on the device this run trains on (train/config.py precision_on)."""
    return precision_on(config, resolve_device(config))


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
    world = launch().world
    if world > 1:
        kwargs["kwargs_handlers"] = [InitProcessGroupKwargs(backend=backend)]
    if world > 1 and dist.strategy == "deepspeed":
        from accelerate.utils import DeepSpeedPlugin

        kwargs["deepspeed_plugin"] = DeepSpeedPlugin(hf_ds_config=deepspeed_config(config))
    elif world > 1 and dist.strategy == "fsdp":
        from accelerate.utils import FullyShardedDataParallelPlugin

        kwargs["fsdp_plugin"] = FullyShardedDataParallelPlugin(use_orig_params=True)
    if world == 1:
        # accelerate keeps one state per process and refuses a second Accelerator with another precision; a
        # single-process caller that trains twice (the demo, scripts/bench/ablate.py's fp32 and bf16 rows) starts afresh
        from accelerate.state import AcceleratorState

        AcceleratorState._reset_state()
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


# ----------------------------------------------------------------------------------------- checkpoints

def latest_checkpoint(out_dir: Path) -> Path | None:
    from draftsmith.serve.core.whole_folder import clean_stale

    root = out_dir / CHECKPOINTS
    for aside in root.glob(".step_*.old-*"):  # a run killed mid-swap (save_checkpoint): its checkpoint goes back
        clean_stale(root / aside.name[1:].split(".old-")[0])
    done = sorted(p for p in root.glob("step_*") if p.suffix != ".tmp" and (p / STATE_NAME).is_file())
    return done[-1] if done else None


def save_checkpoint(accelerator, out_dir: Path, step: int, keep: int, extra: dict,
                    files: dict[str, dict] | None = None) -> None:
    """accelerate's save_state (model, optimizer, scheduler, RNG) into a temp folder, renamed when complete,
    so a kill -9 mid-save leaves the previous checkpoint intact; a failure or Ctrl-C mid-save removes the temp
    folder, and a full disk is a DiskFullError. An earlier checkpoint of the same step is swapped out, never
    deleted first (serve/core/whole_folder.py). files: name -> tensors saved beside it."""
    from draftsmith.serve.core.files import disk_full, full_disk_error
    from draftsmith.serve.core.whole_folder import move_into_place

    root = out_dir / CHECKPOINTS
    final, tmp = root / f"step_{step:08d}", root / f"step_{step:08d}.tmp"
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
    accelerator.wait_for_everyone()
    try:
        accelerator.save_state(str(tmp))
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            from safetensors.torch import save_file

            for name, tensors in (files or {}).items():
                save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp / name))
            (tmp / STATE_NAME).write_text(json.dumps({"step": step, **extra}))
            # inside the guard: a Ctrl-C between the write and the rename must not leave the complete temp folder
            move_into_place(tmp, final, replace=True)
    except BaseException as err:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(err, Exception) and disk_full(err, root):
            previous = latest_checkpoint(out_dir)
            raise full_disk_error(f"the checkpoint {final.name} in {root} (training resumes from "
                                  f"{previous.name if previous else 'the start'})", root) from err
        raise
    if accelerator.is_main_process:
        for old in sorted(p for p in root.glob("step_*") if p.suffix != ".tmp")[:-max(keep, 1)]:
            shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()


def resume(accelerator, out_dir: Path, best: BestTracker) -> tuple[int, Path | None]:
    """Load the latest complete checkpoint under out_dir (model, optimizer, scheduler, RNG, and into `best` the
    best head so far): (the step it was saved after, its folder), or (0, None) when there is none."""
    from safetensors.torch import load_file

    ckpt = latest_checkpoint(out_dir)
    if ckpt is None:
        return 0, None
    accelerator.load_state(str(ckpt))
    saved = json.loads((ckpt / STATE_NAME).read_text())
    if "best" in saved and (ckpt / BEST_NAME).is_file():
        best.best_score, best.best_step, best.stale = (saved["best"][k] for k in ("best_score", "best_step", "stale"))
        best.best_state = load_file(str(ckpt / BEST_NAME))
    return saved["step"], ckpt


def checkpoint(accelerator, out_dir: Path, done: int, *, keep: int, total_steps: int, best: BestTracker) -> None:
    """A checkpoint after step `done`, with the best head so far beside it."""
    extra = {"total_steps": total_steps}
    if best.best_state is not None:
        extra["best"] = best.to_json()
    save_checkpoint(accelerator, out_dir, done, keep, extra,
                    files={BEST_NAME: best.best_state} if best.best_state is not None else {})


# ------------------------------------------------------------------------------------------------ loop

@dataclass
class TimeBudget:
    """optim.max_seconds: after CALIBRATION_STEPS steps the run's length is fitted to the time left, and again every
    REFIT_EVERY steps from the rate so far (within the run's own epochs or max_steps); a step that ends past the
    budget is the last."""
    max_seconds: float
    clock: float  # perf_counter() when the stage began
    start_step: int
    eval_seconds: float  # one held-out evaluation (timed at step 0, then at every evaluation)
    eval_every: int
    step_seconds: float = 0.0
    cap: int = 0  # the most steps the run may take (its epochs or max_steps)
    _fitted: bool = False
    _timed_from: float = 0.0
    _eval_spent: float = 0.0  # evaluation seconds inside the timed stretch

    def evaluated(self, seconds: float) -> None:
        self.eval_seconds = seconds
        if self._timed_from:
            self._eval_spent += seconds

    def fit(self, done: int, total_steps: int) -> int | None:
        """The run's new last step, or None to go on as planned."""
        if self.max_seconds <= 0:
            return None
        now = time.perf_counter()
        self.cap = self.cap or total_steps
        if done == self.start_step + 1:  # the first step pays for warm-up: time the ones after it
            self._timed_from, self._eval_spent = now, 0.0
            return None
        elapsed = now - self.clock
        if elapsed >= self.max_seconds:
            return done
        steps = done - self.start_step - 1
        if steps < CALIBRATION_STEPS or (self._fitted and steps % REFIT_EVERY):
            return None
        self._fitted = True
        self.step_seconds = (now - self._timed_from - self._eval_spent) / steps
        fitted = steps_within(self.max_seconds, elapsed=elapsed, step_seconds=self.step_seconds,
                              eval_seconds=self.eval_seconds, eval_every=self.eval_every, done=done,
                              total_steps=self.cap)
        return None if abs(fitted - total_steps) <= max(1, 0.02 * total_steps) else fitted


def _agreed(accelerator, value: int | None) -> int | None:
    """The main process's decision on every process (their clocks differ; their steps must not)."""
    if accelerator.num_processes == 1:
        return value
    from accelerate.utils import broadcast_object_list

    return broadcast_object_list([value])[0]


def _head_state(accelerator, model) -> dict:
    """The head's tensors (CPU) gathered from every shard; call on every process, use on the main one."""
    state = accelerator.get_state_dict(model)
    if not accelerator.is_main_process:
        return {}
    return {k[len("head."):]: v.detach().cpu() for k, v in state.items() if k.startswith("head.")}


def _reduced(accelerator, agreement: Agreement) -> Agreement:
    return Agreement.from_tensor(accelerator.reduce(agreement.as_tensor().to(accelerator.device),
                                                    reduction="sum").cpu())


@dataclass
class Evaluator:
    """Agreement of the head with the target on the held-out rows and on a fixed sample of training rows: each
    process rates its share, the sums are reduced over processes (under ZeRO-3 / FSDP on gathered parameters)."""
    accelerator: object
    model: torch.nn.Module         # as accelerate prepared it
    rows: object                   # the training rows (train_probe points into them)
    held_out_rows: object          # where eval_idx points
    eval_idx: list[int]
    train_probe: list[int]
    make_batch: Callable[[list[dict]], tuple[FeatureBatch, float]]
    positions: int
    drain: Callable[[], None] | None = None  # a target split over the processes: keep its forwards in step

    def __call__(self) -> dict:
        accelerator, model = self.accelerator, self.model
        world, rank = accelerator.num_processes, accelerator.process_index
        objective = accelerator.unwrap_model(model)
        model.eval()
        with _gathered(accelerator, model):
            held = agreement_over(objective, self.held_out_rows, self.eval_idx[rank::world], self.make_batch,
                                  self.positions)
            seen = agreement_over(objective, self.rows, self.train_probe[rank::world], self.make_batch, self.positions)
        if self.drain is not None:  # the processes rate unequal shares: the last forwards run in lock-step
            self.drain()
        model.train()
        record = _reduced(accelerator, held).summary()
        if self.train_probe:
            train = _reduced(accelerator, seen).summary()
            record.update({"train_agreement": train["agreement"], "train_mu_tf": train["mu_tf"]})
        return record


def train_step(accelerator, model, optimizer, scheduler, micro: list[list[tuple[int, int]]], *, rows,
               make_batch: Callable[[list[dict]], tuple[FeatureBatch, float]], weights: dict[str, float],
               optim, seed: int) -> StepStats:
    """One optimizer step over this process's micro-batches ([(stream position, row index)] each)."""
    t0, cpu0 = time.time(), time.process_time()
    world = accelerator.num_processes
    batches, target_seconds, tokens = [], 0.0, 0
    for part in micro:
        batch, seconds = make_batch([rows[i] for _, i in part])
        seeds = torch.tensor([seed * 1_000_003 + pos for pos, _ in part], dtype=torch.long)
        batches.append((batch, seeds))
        target_seconds += seconds
        tokens += int(batch.attention_mask.sum())
    objective = accelerator.unwrap_model(model)
    counts = {}
    for batch, _ in batches:
        for name, value in objective.term_counts(batch).items():
            counts[name] = counts.get(name, 0) + value.float()
    names = sorted(counts)
    reduced = accelerator.reduce(torch.stack([counts[n] for n in names]).to(accelerator.device), reduction="sum")
    global_counts = dict(zip(names, reduced.tolist()))
    term_sums: dict[str, float] = {}
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
    if world > 1:  # the logged losses are those of the global batch, as one process over it would log them
        summed = accelerator.reduce(torch.tensor([term_sums[n] for n in sorted(term_sums)], dtype=torch.float64,
                                                 device=accelerator.device), reduction="sum")
        term_sums = dict(zip(sorted(term_sums), summed.tolist()))
    scheduler.step()
    return StepStats(tokens=tokens, seconds=time.time() - t0, cpu_seconds=time.process_time() - cpu0,
                     target_seconds=target_seconds, term_sums=term_sums, term_counts=global_counts)


def train_loop(config: TrainConfig, *, objective: Objective, rows, train_idx: list[int], eval_idx: list[int],
               make_batch: Callable[[list[dict]], tuple[FeatureBatch, float]], out_dir: Path,
               tracker_factory: Callable[..., object], eval_positions: int, eval_rows=None,
               drain: Callable[[], None] | None = None) -> LoopResult:
    """Train `objective.head`. make_batch(rows) -> (FeatureBatch on the device, seconds spent in the target).

    drain: when make_batch forwards a target split over the processes (collectives), called after every stretch
    where processes make unequal numbers of batches (the evaluation), so that their forwards stay in step.

    eval_rows: where `eval_idx` points (a held-out dataset or cache of its own); default the training rows.
    With log.eval_every, every evaluation logs held-out and train agreement; optim.keep_best returns the head of
    the best held-out evaluation, optim.early_stop_patience stops after that many evaluations without progress.
    """
    from accelerate.utils import set_seed

    clock = time.perf_counter()  # optim.max_seconds counts from here
    accelerator = make_accelerator(config)
    set_seed(config.seed)
    world, rank = accelerator.num_processes, accelerator.process_index
    optim = config.optim
    global_batch = optim.batch_size * world * optim.grad_accum
    order = DataOrder(train_idx, seed=config.seed, global_batch=global_batch)
    check_rows_fill_a_batch(len(train_idx), batch_size=optim.batch_size, grad_accum=optim.grad_accum, world=world)
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
    cadence = Cadence.of(config, total_steps, periodic_eval=periodic)
    best = BestTracker(patience=optim.early_stop_patience if periodic else 0)
    start_step, ckpt = resume(accelerator, out_dir, best) if config.checkpoint.resume else (0, None)
    tracker = tracker_factory(enabled=accelerator.is_main_process, total_steps=total_steps, start_step=start_step)
    tracker.log({"event": "start", "processes": world, "distributed_type": str(accelerator.distributed_type),
                 "precision": resolve_precision(config), "total_steps": total_steps, "global_batch": global_batch},
                step=start_step)
    if ckpt is not None:
        tracker.log({"event": "resumed", "checkpoint": str(ckpt)}, step=start_step)

    evaluate = Evaluator(accelerator=accelerator, model=model, rows=rows,
                         held_out_rows=rows if eval_rows is None else eval_rows, eval_idx=eval_idx,
                         train_probe=sample_rows(train_idx, min(len(eval_idx), config.log.train_eval_rows),
                                                 seed=config.seed),
                         make_batch=make_batch, positions=eval_positions, drain=drain)
    eval_seconds = 0.0
    if start_step == 0 and eval_idx:
        began = time.perf_counter()
        tracker.log({"event": "eval", **evaluate(), "trained": False}, step=0)
        eval_seconds = time.perf_counter() - began

    model.train()
    window = MetricWindow(world=world, weights=weights, total_steps=total_steps, steps_per_epoch=order.steps_per_epoch)
    last_eval: dict = {}
    stopped_at = total_steps
    budget = TimeBudget(optim.max_seconds, clock=clock, start_step=start_step, eval_seconds=eval_seconds,
                        eval_every=cadence.eval_every)
    step = start_step - 1
    while step + 1 < total_steps:
        step += 1
        micro = order.micro_batches(step, batch_size=optim.batch_size, grad_accum=optim.grad_accum, world=world,
                                    rank=rank)
        window.add(train_step(accelerator, model, optimizer, scheduler, micro, rows=rows, make_batch=make_batch,
                              weights=weights, optim=optim, seed=config.seed))
        tracker.advance()
        done = step + 1
        if cadence.logs(done):
            tracker.log(window.record(step=step, lr=scheduler.get_last_lr()[0]), step=done)
        evaluated = cadence.evaluates(done)
        if evaluated:
            began = time.perf_counter()
            last_eval = evaluate()
            budget.evaluated(time.perf_counter() - began)
            improved = best.update(last_eval["mu_tf"], done, lambda: _head_state(accelerator, model))
            tracker.log({"event": "eval", **last_eval, "trained": True, "best": improved,
                         "final": done == total_steps}, step=done)
            if best.should_stop:
                tracker.log({"event": "early_stop", **best.to_json()}, step=done)
                stopped_at = done
                break
        if cadence.checkpoints(done):
            checkpoint(accelerator, out_dir, done, keep=config.checkpoint.keep, total_steps=total_steps, best=best)
        fitted = _agreed(accelerator, budget.fit(done, total_steps))
        if fitted is not None and fitted != total_steps:
            tracker.log({"event": "time_budget", "max_seconds": optim.max_seconds, "total_steps": fitted,
                         "planned_steps": total_steps, "most_steps": budget.cap, "step_seconds": round(budget.step_seconds, 4)}, step=done)
            total_steps = fitted
            scheduler.lr_lambdas = [lr_lambda(config, total_steps)]  # the schedule ends where the run now ends
            cadence = Cadence.of(config, total_steps, periodic_eval=periodic)
            window.total_steps = total_steps
            tracker.retotal(total_steps)
            stopped_at = total_steps
            if done == total_steps and periodic and not evaluated:  # the budget ran out at this step
                last_eval = evaluate()
                improved = best.update(last_eval["mu_tf"], done, lambda: _head_state(accelerator, model))
                tracker.log({"event": "eval", **last_eval, "trained": True, "best": improved, "final": True},
                            step=done)

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
