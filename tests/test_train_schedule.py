"""Data order and learning-rate schedule: pure functions of the step, so a resume needs only the step."""
from __future__ import annotations

from draftsmith.serve.core.config import load_config
from draftsmith.train.config import TrainConfig
from draftsmith.train.features import split_rows
from draftsmith.train.loop import deepspeed_config
from draftsmith.train.schedule import DataOrder, lr_lambda


def test_data_order_covers_each_epoch_once_and_depends_only_on_the_step():
    rows = list(range(100, 111))  # 11 rows, global batch 4: 2 steps per epoch, 3 rows dropped each epoch
    order = DataOrder(rows, seed=5, global_batch=4)
    assert order.steps_per_epoch == 2
    epoch0 = [i for s in range(2) for _, i in order.batch(s)]
    assert len(set(epoch0)) == 8 and set(epoch0) <= set(rows)
    assert [p for p, _ in order.batch(3)] == [12, 13, 14, 15]  # stream positions seed EAGLE-1's noise
    fresh = DataOrder(rows, seed=5, global_batch=4)
    assert fresh.batch(3) == order.batch(3) and fresh.batch(0) == DataOrder(rows, seed=5, global_batch=4).batch(0)
    assert DataOrder(rows, seed=6, global_batch=4).batch(0) != order.batch(0)


def test_split_rows_holds_out_a_seeded_subset():
    train, held = split_rows(20, eval_rows=4, seed=0)
    assert len(held) == 4 and sorted(train + held) == list(range(20))
    assert split_rows(20, eval_rows=4, seed=0) == (train, held)
    train, held = split_rows(20, eval_rows=4, seed=0, max_rows=10)
    assert len(train) == 6


def test_lr_schedule_and_generated_deepspeed_config():
    config = load_config(TrainConfig, overrides=["optim.warmup_steps=2", "optim.schedule=cosine",
                                                 "optim.batch_size=3", "optim.grad_accum=2",
                                                 "distributed.zero_stage=3", "optim.max_grad_norm=0.7"])
    f = lr_lambda(config, 12)
    assert [f(0), f(1)] == [0.5, 1.0] and f(2) == 1.0 and abs(f(12)) < 1e-9 and 0 < f(7) < 1
    ds = deepspeed_config(config)
    assert ds["train_micro_batch_size_per_gpu"] == 3 and ds["gradient_accumulation_steps"] == 2
    assert ds["zero_optimization"]["stage"] == 3 and ds["gradient_clipping"] == 0.7
    assert ds["bf16"]["enabled"] is False  # fp32 on CPU


def test_cadence_logs_and_evaluates_the_last_step_and_never_checkpoints_it():
    from draftsmith.train.schedule import Cadence

    cadence = Cadence(total_steps=10, log_every=4, eval_every=3, checkpoint_every=5)
    assert [d for d in range(1, 11) if cadence.logs(d)] == [4, 8, 10]
    assert [d for d in range(1, 11) if cadence.evaluates(d)] == [3, 6, 9, 10]
    assert [d for d in range(1, 11) if cadence.checkpoints(d)] == [5]
    quiet = Cadence(total_steps=10, log_every=1, eval_every=0, checkpoint_every=0)
    assert not any(quiet.evaluates(d) or quiet.checkpoints(d) for d in range(1, 11))


def test_metric_window_means_over_the_steps_since_the_last_record():
    from draftsmith.train.metrics import MetricWindow, StepStats

    window = MetricWindow(world=2, weights={"ce": 1.0, "feature": 0.5}, total_steps=8, steps_per_epoch=4)
    for _ in range(2):
        window.add(StepStats(tokens=10, seconds=2.0, cpu_seconds=1.0, target_seconds=0.5,
                             term_sums={"ce": 3.0, "feature": 1.0}, term_counts={"ce": 6.0, "feature": 4.0}))
    record = window.record(step=5, lr=0.1)  # sums and counts are both over every process already
    assert record["loss/ce"] == 6.0 / 12.0 and record["loss/feature"] == 2.0 / 8.0
    assert record["loss"] == 0.5 + 0.5 * 0.25
    assert record["tokens"] == 40 and record["tokens_per_s"] == 10.0 and record["step_seconds"] == 2.0
    assert record["tokens_per_cpu_s"] == 10.0 and record["target_share"] == 0.25 and record["epoch"] == 1
    assert window.tokens == 0 and window.term_sums == {} and window.steps_done == 2
