"""`train_drafter(config) -> Path`: target + rows -> head -> training loop -> native drafter folder.

Output folder (config.out_dir):
    drafter/                  the native drafter folder (config.json, model.safetensors, config.resolved.yaml),
                              written whole in a temporary sibling and renamed into place; a finished run's
                              drafter is replaced by the same run, or by another only with `overwrite`
                              (train/earlier_drafter.py)
    train_log.jsonl           losses per term, agreement per position, lr, tokens/s, ETA
    checkpoints/step_N/       periodic checkpoints (resumed automatically by the same command)
    deepspeed_config.json     written when the DeepSpeed strategy is used (generated from the config)
"""
from __future__ import annotations

import json
import shutil
import sys
import time
from functools import partial
from pathlib import Path

import torch

from draftsmith.serve.core.config import save_config, to_dict
from draftsmith.serve.drafters.folder import build_head, load_head, save_drafter
from draftsmith.serve.drafters.head_config import HeadConfig
from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.core.files import write_text_atomic
from draftsmith.serve.core.whole_folder import whole_folder
from draftsmith.train.config import TrainConfig, check
from draftsmith.train.earlier_drafter import DRAFTER_DIR, check_earlier_drafter
from draftsmith.train.features import collate, open_rows, split_rows, target_features
from draftsmith.train.heads import continued_config, head_config, needed_layers
from draftsmith.serve.methods.objective import TargetParts
from draftsmith.serve.methods.registry import method
from draftsmith.train.objectives import build_objective
from draftsmith.train.preflight import check_data_target, check_rows_fill_a_batch, check_token_ids
from draftsmith.serve.core.target import Target


def init_head(cfg: HeadConfig, target: Target, rows, train_idx: list[int], *, vocab_rows: int, seed: int):
    """A fresh head; one with a reduced vocabulary gets d2t/t2d from the training rows' loss-masked token counts; a
    head that starts from the target's lm_head (`init_from_target`: Medusa's) is given it, and one whose method starts
    elsewhere (its registry record's `start`: the layer the target ships, MTP's) is given that."""
    torch.manual_seed(seed)
    head = build_head(cfg)
    coverage = 1.0
    if cfg.uses_draft_vocab:
        from draftsmith.data.vocab import select_draft_vocab

        picked = train_idx[:vocab_rows] if vocab_rows else train_idx
        counted = ({"input_ids": rows[i]["input_ids"], "loss_mask": rows[i]["loss_mask"]} for i in picked)
        d2t, t2d, coverage = select_draft_vocab(counted, cfg.vocab_size, cfg.draft_vocab_size)
        head.set_vocab(d2t, t2d)
    if hasattr(head, "init_from_target"):
        from draftsmith.serve.core.sharded_target import full_tensor

        head.init_from_target(full_tensor(target.model.get_output_embeddings().weight).float().cpu())
    start = method(cfg.method).start
    started = start is not None and start(head, target)  # True, or what it started from
    if started:  # the target's own MTP layer, a drafter shipped beside it
        source = started if isinstance(started, str) else f"the layer {target.name} ships"
        print(f"train: model.method={cfg.method} starts from {source}", file=sys.stderr)
    return head, coverage


def _batch_maker(config: TrainConfig, target: Target, layers, device, *, online: bool, top1_from=None,
                 forward=None):
    """rows -> (FeatureBatch on the device, seconds in the target). top1_from: TargetParts that fill in the
    target's argmax once per batch when the cache does not carry it and the loss needs it. forward: the objective's
    own forward of the target (Objective.target_forward), None for its hidden states at `layers`."""
    if forward is not None and target.sharded is not None:
        raise DraftsmithError(f"model.method={config.model.method} reads more of the target's forward than its hidden "
                              f"states, which a target split over processes does not hand out: train it unsplit")
    features = forward or target_features

    def make(batch_rows):
        batch = collate(batch_rows, max_length=config.data.max_length, layers=() if online else layers)
        batch = batch.to(device)
        seconds = 0.0
        if online:
            t0 = time.time()
            if target.sharded is not None:  # a lock-step forward of the split target (serve/core/sharded_target.py)
                batch.hidden_states = target.sharded.forward(batch.input_ids, batch.attention_mask, layers)[0]
            else:
                batch.hidden_states = features(target.model, batch.input_ids, batch.attention_mask, layers)
            seconds = time.time() - t0
        if top1_from is not None and batch.target_top1 is None:
            batch.target_top1 = top1_from.top1(batch)
        return batch, seconds
    return make


def train_drafter(config: TrainConfig, *, overwrite: bool = False) -> Path:
    """Train the drafter `config` describes; returns the native drafter folder (written by the main process).
    overwrite: replace a drafter another run finished in out_dir (and start afresh, not from its checkpoints)."""
    from draftsmith.serve.core.launch_target import check_launch_inputs, load_launch_target
    from draftsmith.serve.core.process_group import launch, start
    from draftsmith.serve.core.target import text_config
    from draftsmith.train.loop import deepspeed_config, resolve_device, resolve_precision, train_loop
    from draftsmith.train.plan import train_workload
    from draftsmith.train.tracking import Tracker

    check(config)
    out_dir = Path(config.out_dir)
    earlier = check_earlier_drafter(config, overwrite=overwrite)  # before any weight is loaded
    here = launch()
    for note in check_data_target(config):  # before any weight is loaded
        if here.is_main:
            print(note, file=sys.stderr)
    device = resolve_device(config)
    backend = config.distributed.backend
    start(device_type=device, command="train --config RECIPE.yaml", backend=backend)
    if earlier is not None and not earlier.same_run:
        _start_afresh(out_dir, earlier.description, is_main=here.is_main)
    check_launch_inputs(recipe=to_dict(config), spec=config.target.spec)
    if device == "cuda":
        device = f"cuda:{here.local_rank}"
    dtype = "bfloat16" if resolve_precision(config) == "bf16" else "float32"
    target = load_launch_target(config.target, dtype=dtype, device=device,
                                workload=partial(train_workload, config, precision=resolve_precision(config)))
    cfg = continued_config(config, target) if config.model.init_from else head_config(config, target)
    layers = needed_layers(cfg)
    online = config.data.mode == "online"
    rows = open_rows(config.data.mode, dataset=config.data.dataset, cache=config.data.cache, target=target,
                     layers=layers, target_spec=config.target.spec, allow_other_target=config.data.allow_other_target)
    held_out = config.data.eval_cache or config.data.eval_dataset
    eval_rows = open_rows(config.data.mode, dataset=config.data.eval_dataset, cache=config.data.eval_cache,
                          target=target, layers=layers, target_spec=config.target.spec,
                          allow_other_target=config.data.allow_other_target) if held_out else None
    train_idx, eval_idx = split_rows(len(rows), eval_rows=0 if held_out else config.data.eval_rows, seed=config.seed,
                                     max_rows=config.data.max_rows)
    if eval_rows is not None:
        eval_idx = list(range(len(eval_rows)))
    vocab_size = text_config(target.config).vocab_size
    check_token_ids(rows, vocab_size, where=config.data.dataset)
    if eval_rows is not None:
        check_token_ids(eval_rows, vocab_size, where=config.data.eval_dataset)
    check_rows_fill_a_batch(len(train_idx), batch_size=config.optim.batch_size, grad_accum=config.optim.grad_accum,
                            world=here.world)
    out_dir.mkdir(parents=True, exist_ok=True)  # only now: a run refused above leaves no folder behind
    if config.model.init_from:  # a refresh: the drafter's own weights and draft vocabulary are the start
        head, coverage = load_head(config.model.init_from), None
    else:
        head, coverage = init_head(cfg, target, rows, train_idx, vocab_rows=config.data.vocab_rows, seed=config.seed)
    head.to(device)
    loss = config.loss
    parts = TargetParts.of(target)
    objective = build_objective(head, parts, ttt_steps=config.model.ttt_steps, decay=loss.decay,
                                feature_noise=loss.feature_noise, feature_weight=loss.feature_weight,
                                ce_weight=loss.ce_weight, aux_noise=loss.aux_noise, prompt_weight=loss.prompt_weight,
                                kind=loss.kind, lk_eta=loss.lk_eta, anchors=config.model.anchors,
                                position_weighting=loss.position_weighting, dpace_smoothing=loss.dpace_smoothing)
    if config.distributed.strategy == "deepspeed":
        (out_dir / "deepspeed_config.json").write_text(json.dumps(deepspeed_config(config), indent=2))
    resolved = to_dict(config)
    tracker_factory = partial(Tracker, out_dir, use_wandb=config.tracking == "wandb", config=resolved,
                              progress=config.log.progress, project=config.log.wandb_project,
                              run_name=config.log.run_name)
    eval_positions = config.log.eval_positions or cfg.num_speculative_tokens
    result = train_loop(config, objective=objective, rows=rows, train_idx=train_idx, eval_idx=eval_idx,
                        make_batch=_batch_maker(config, target, layers, device, online=online,
                                                top1_from=parts if objective.needs_top1 else None,
                                                forward=objective.target_forward),
                        out_dir=out_dir, tracker_factory=tracker_factory, eval_positions=eval_positions,
                        eval_rows=eval_rows, drain=target.sharded.drain if target.sharded is not None else None)
    drafter_dir = out_dir / DRAFTER_DIR
    if result.is_main:
        final = build_head(cfg)
        missing, unexpected = final.load_state_dict(result.state_dict, strict=False)
        if missing or unexpected:
            raise DraftsmithError(f"trained state does not match the head: missing {missing[:5]}, "
                                  f"unexpected {unexpected[:5]}")
        lengths = rows.row_lengths()
        train_tokens = sum(min(lengths[i], config.data.max_length) for i in train_idx)
        # whole or not at all: a kill or a full disk never leaves new weights beside an earlier config
        with whole_folder(drafter_dir, replace=earlier is not None) as folder:
            save_drafter(final, cfg, folder)
            save_config(config, folder)
            write_text_atomic(folder / "training_summary.json", json.dumps(
                {"steps": result.steps, "eval": result.eval, "draft_vocab_coverage": coverage,
                 "train_rows": len(train_idx), "eval_rows": len(eval_idx), "train_tokens": train_tokens,
                 "epochs": round(result.epochs, 4), "token_epochs": round(train_tokens * result.epochs)}, indent=2))
    return drafter_dir


def _start_afresh(out_dir: Path, replaced: str, *, is_main: bool) -> None:
    """--overwrite of another run's drafter: its checkpoints would be resumed (and outlive this run's pruning)."""
    from draftsmith.train.loop import CHECKPOINTS

    if is_main:
        print(f"train: {out_dir} holds {replaced} of another run: --overwrite replaces it when this run ends; its "
              f"checkpoints are removed so that this run starts from step 0", file=sys.stderr)
        shutil.rmtree(out_dir / CHECKPOINTS, ignore_errors=True)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()  # no process looks for a checkpoint before they are gone
