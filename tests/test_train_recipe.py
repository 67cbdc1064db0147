"""The recipe options: EAGLE-3 feature norms and noise, held-out agreement beside train agreement,
the teacher-forced μ estimate, a held-out set of its own, the best head kept, early stopping, the target's top-1
stored in the cache."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from draftsmith.serve.core.config import load_config
from draftsmith.serve.decoding import plain_generate, speculative_generate
from draftsmith.serve.drafters import build_drafter
from draftsmith.serve.core.target import load_target
from tests.train_fixtures import EAGLE3_LAYERS, greedy_rows, save_rows, sharp_target
from draftsmith.train.config import TrainConfig
from draftsmith.serve.methods.objective import agreement_of
from draftsmith.train.run import train_drafter
from draftsmith.train.tracking import read_log


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    from draftsmith.data.capture import capture_hidden_states
    from draftsmith.data.config import CaptureConfig

    root = tmp_path_factory.mktemp("recipe")
    target_dir = sharp_target(root / "target", num_hidden_layers=EAGLE3_LAYERS)
    rows = greedy_rows(target_dir, rows=40, new_tokens=24)
    train, held = save_rows(rows[:32], root / "train"), save_rows(rows[32:], root / "held")
    target = load_target(target_dir)
    for name, data in (("train", train), ("held", held)):
        capture_hidden_states(target, data, root / f"cache-{name}", CaptureConfig(layers="eagle3", storage_dtype="fp32"),
                              progress=False, log=lambda *_: None)
    return target_dir, root


def _config(target, root, out, *extra: str) -> TrainConfig:
    return load_config(TrainConfig, overrides=[
        f"target={target}", "data.mode=offline", f"data.cache={root / 'cache-train'}", f"out_dir={root / out}",
        "model.method=eagle3", "model.num_speculative_tokens=3", "model.ttt_steps=2", "model.draft_vocab_size=200",
        "optim.batch_size=4", "optim.max_steps=24", "optim.lr=1e-2", "data.eval_rows=4", "tracking=none",
        "log.progress=false", "log.every=8", "checkpoint.every=0", *extra])


def test_agreement_counts_leading_runs():
    # two rows of 6 tokens; every position is a loss token
    top1 = torch.tensor([[10, 11, 12, 13, 14, 15], [20, 21, 22, 23, 24, 25]])
    mask = torch.ones(2, 6, dtype=torch.long)
    # position 1 drafts for x_{t+2}: right everywhere on row 0, right only at t=0 on row 1
    d1 = torch.tensor([[11, 12, 13, 14, 15, 0], [21, 0, 0, 0, 0, 0]])
    d2 = torch.tensor([[12, 0, 14, 15, 0, 0], [22, 0, 0, 0, 0, 0]])  # position 2: x_{t+3}
    got = agreement_of([d1, d2], top1, mask)
    # loss rows for position 1 are t = 0..3 (x_{t+2} must be a loss token), for position 2 t = 0..2
    assert got.rows.tolist() == [8.0, 6.0]
    assert got.hits.tolist() == [5.0, 3.0]  # row 0: t=0..3 and row 1: t=0; position 2: row 0 t=0, 2, row 1 t=0
    # leading runs from the 8 starts: row 0: 2, 1, 2, 1 (t=3 has no position-2 row); row 1: 2, 0, 0, 0
    assert got.starts == 8.0 and got.run_sum == 8.0
    assert got.summary()["mu_tf"] == pytest.approx(2.0)


def test_cache_stores_the_targets_top1(job):
    from draftsmith.data.capture import CacheReader

    target_dir, root = job
    target = load_target(target_dir)
    row = CacheReader(root / "cache-held")[0]
    with torch.no_grad():
        logits = target.model(row["input_ids"][None]).logits[0]
    assert torch.equal(row["target_top1"], logits.argmax(-1))


@pytest.mark.parametrize("norm", ["model.fc_norm=true", "model.norm_before_fc=true", "model.norm_output=true"])
def test_feature_norms_train_and_draft_losslessly(job, norm):
    target_dir, root = job
    name = norm.split(".")[1].split("=")[0]
    folder = train_drafter(_config(target_dir, root, name, norm, "loss.aux_noise=0.05"))
    config = json.loads((folder / "config.json").read_text())
    weights = load_file(str(folder / "model.safetensors"))
    if name == "fc_norm":
        assert config["fc_norm"] and [k for k in weights if k.startswith("fc_norm.")] == \
            ["fc_norm.0.weight", "fc_norm.1.weight", "fc_norm.2.weight"]
    elif name == "norm_before_fc":
        assert config["norm_before_fc"] and weights["input_norm.weight"].shape == (3 * 32,)
    else:  # EAGLE-3.1: the next step reads norm(out); no tensor of its own
        assert config["norm_output"] and not any(k.startswith(("fc_norm.", "input_norm.")) for k in weights)
    target = load_target(target_dir)
    drafter = build_drafter(str(folder), target)
    prompt = torch.randint(0, 256, (1, 6), generator=torch.Generator().manual_seed(3))
    plain = plain_generate(target, prompt, max_new_tokens=20).output_ids
    assert speculative_generate(target, drafter, prompt, max_new_tokens=20, k=3).output_ids == plain


def test_aux_noise_is_seeded_and_changes_the_loss(job):
    from draftsmith.serve.drafters.folder import build_head
    from draftsmith.train.features import open_rows
    from draftsmith.serve.methods.objective import TargetParts
    from draftsmith.train.objectives import build_objective
    from draftsmith.train.run import _batch_maker, head_config, needed_layers

    target_dir, root = job
    target = load_target(target_dir)
    config = _config(target_dir, root, "noise")
    cfg = head_config(config, target)
    rows = open_rows("offline", cache=str(root / "cache-train"), target=target, layers=needed_layers(cfg))
    batch, _ = _batch_maker(config, target, needed_layers(cfg), "cpu", online=False)([rows[0], rows[1]])
    torch.manual_seed(0)
    head = build_head(cfg)
    seeds = torch.tensor([5, 6])
    losses = []
    for noise in (0.0, 0.1, 0.1):
        objective = build_objective(head, TargetParts.of(target), ttt_steps=2, decay=0.8, feature_noise=0.1,
                                    feature_weight=1.0, ce_weight=0.1, aux_noise=noise)
        losses.append(float(objective(batch.input_ids, batch.loss_mask, batch.hidden_states, batch.attention_mask,
                                      seeds, batch.target_top1)["ttt0"].detach()))
    assert losses[1] == losses[2] != losses[0]


def test_held_out_set_curves_and_best_head(job):
    """A held-out cache of its own: every evaluation logs held-out and train agreement and mu_tf; the drafter
    written is the best evaluation's head (its mu_tf recomputed from the saved weights)."""
    from draftsmith.serve.drafters.folder import load_head
    from draftsmith.train.evaluate import agreement_over
    from draftsmith.train.features import open_rows
    from draftsmith.serve.methods.objective import TargetParts
    from draftsmith.train.objectives import build_objective
    from draftsmith.train.run import _batch_maker, head_config, needed_layers

    target_dir, root = job
    config = _config(target_dir, root, "best", f"data.eval_cache={root / 'cache-held'}", "log.eval_every=6",
                     "log.train_eval_rows=4")
    folder = train_drafter(config)
    evals = [r for r in read_log(root / "best") if r.get("event") == "eval"]
    assert [r["trained"] for r in evals] == [False, True, True, True, True]
    for record in evals:
        assert len(record["agreement"]) == 3 and len(record["train_agreement"]) == 3
        assert 1.0 <= record["mu_tf"] <= 4.0
    assert evals[-1]["train_agreement"][0] > evals[0]["train_agreement"][0]
    best = max(evals[1:], key=lambda r: r["mu_tf"])
    summary = json.loads((folder / "training_summary.json").read_text())
    assert summary["eval"]["best"]["best_step"] == [r for r in read_log(root / "best")
                                                    if r.get("event") == "eval" and r.get("best")][-1]["step"]

    target = load_target(target_dir)
    cfg = head_config(config, target)
    held = open_rows("offline", cache=str(root / "cache-held"), target=target, layers=needed_layers(cfg))
    objective = build_objective(load_head(folder), TargetParts.of(target), ttt_steps=2, decay=0.8,
                                feature_noise=0.0, feature_weight=1.0, ce_weight=0.1)
    make = _batch_maker(config, target, needed_layers(cfg), "cpu", online=False)
    again = agreement_over(objective, held, list(range(len(held))), make, 3).summary()
    assert again["mu_tf"] == pytest.approx(best["mu_tf"], abs=1e-4)
    assert again["eval_rows"] == best["eval_rows"]


def test_early_stopping_after_patience(job):
    target_dir, root = job
    folder = train_drafter(_config(target_dir, root, "stop", "optim.lr=0", "log.eval_every=4",
                                   "optim.early_stop_patience=2"))
    log = read_log(root / "stop")
    stop = [r for r in log if r.get("event") == "early_stop"]
    assert stop and stop[0]["best_step"] == 4 and stop[0]["step"] == 12  # nothing improves with lr 0
    assert json.loads((folder / "training_summary.json").read_text())["steps"] == 12


def test_ablation_script_trains_rows_side_by_side(job, tmp_path):
    """scripts/bench/ablate.py: one row per change, reused when rerun, a table and a plot of μ against tokens."""
    import yaml

    from draftsmith.bench.ablate import main

    target_dir, root = job
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"target": str(target_dir), "model": {"method": "eagle3"}}))
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump({
        "recipe": str(recipe), "out_dir": str(tmp_path / "rows"),
        "overrides": ["data.mode=offline", f"data.cache={root / 'cache-train'}",
                      f"data.eval_cache={root / 'cache-held'}", "model.num_speculative_tokens=3",
                      "model.ttt_steps=2", "model.draft_vocab_size=200", "optim.batch_size=4", "optim.max_steps=8",
                      "optim.lr=1e-2", "log.eval_every=4", "tracking=none", "checkpoint.every=0"],
        "rows": {"base": [], "fc-norm": ["model.fc_norm=true"], "bf16": ["distributed.precision=bf16"]}}))
    out = tmp_path / "result.json"
    assert main([str(plan), "--json", str(out), "--plot", str(tmp_path / "curve.png")]) == 0
    result = json.loads(out.read_text())
    assert list(result["rows"]) == ["base", "bf16", "fc-norm"]  # fp32 and bf16 rows in one process
    for row in result["rows"].values():
        assert len(row["agreement"]) == 3 and row["tokens"] > 0 and row["train_tokens"] > 0
    assert "| fc-norm | model.fc_norm=true |" in result["table"]
    assert (tmp_path / "curve.png").stat().st_size > 1000
    first = (tmp_path / "rows" / "base" / "drafter" / "model.safetensors").stat().st_mtime
    decoded = tmp_path / "decoded.json"  # the finished row is reused, not retrained, and decodes beside n-gram
    assert main([str(plan), "--only", "base", "--json", str(decoded), "--decode", "builtin:code", "--decode-limit",
                 "1", "--decode-tokens", "12", "--target", str(target_dir)]) == 0
    assert (tmp_path / "rows" / "base" / "drafter" / "model.safetensors").stat().st_mtime == first
    result = json.loads(decoded.read_text())
    assert set(result["decoded"]["overall"]) == {"base", "ngram"}
    assert result["decoded"]["exactness"]["identical"] == result["decoded"]["exactness"]["total"] > 0
    assert "| ngram | (untrained baseline) |" in result["table"]


def test_prompt_positions_train_with_their_weight(job):
    """loss.prompt_weight: prompt positions become loss rows with that weight (soft targets of the target's own
    distribution); 0 keeps the assistant-only rows."""
    from draftsmith.serve.drafters.folder import build_head
    from draftsmith.train.features import open_rows
    from draftsmith.serve.methods.objective import TargetParts
    from draftsmith.train.objectives import build_objective
    from draftsmith.train.run import _batch_maker, head_config, needed_layers

    target_dir, root = job
    target = load_target(target_dir)
    config = _config(target_dir, root, "prompt", "model.draft_vocab_size=0")
    cfg = head_config(config, target)
    rows = open_rows("offline", cache=str(root / "cache-train"), target=target, layers=needed_layers(cfg))
    batch, _ = _batch_maker(config, target, needed_layers(cfg), "cpu", online=False)([rows[0], rows[1]])
    head = build_head(cfg)
    counts = {}
    for weight in (0.0, 0.5, 1.0):
        objective = build_objective(head, TargetParts.of(target), ttt_steps=2, decay=0.8, feature_noise=0.0,
                                    feature_weight=1.0, ce_weight=0.1, prompt_weight=weight)
        counts[weight] = float(objective.term_counts(batch)["ttt0"])
    assistant = float((batch.loss_mask[:, 2:]).sum())
    everything = float((batch.attention_mask[:, 2:]).sum())
    assert counts[0.0] == assistant and counts[1.0] == everything
    assert counts[0.5] == pytest.approx(assistant + 0.5 * (everything - assistant))
    with pytest.raises(Exception, match="prompt_weight"):
        train_drafter(_config(target_dir, root, "medusa-prompt", "model.method=medusa", "loss.prompt_weight=0.5"))


def test_time_budget_fits_the_run_and_its_schedule(job):
    """optim.max_seconds (what `demo --budget` gives each head): the loop times its first steps, fits its length
    into the budget and ends its learning-rate schedule there, instead of running its 100000 planned steps."""
    import time

    target_dir, root = job
    began = time.perf_counter()
    folder = train_drafter(_config(target_dir, root, "budget", "optim.max_steps=100000", "optim.max_seconds=3",
                                   "log.every=1", "optim.warmup_steps=0"))
    took = time.perf_counter() - began
    log = read_log(root / "budget")
    fitted = [r for r in log if r.get("event") == "time_budget"]
    steps = json.loads((folder / "training_summary.json").read_text())["steps"]
    assert fitted and fitted[0]["planned_steps"] == 100000 and 10 <= steps < 100000
    assert took < 3 + 10  # the run, plus loading and saving around the loop
    lrs = [r["lr"] for r in log if "lr" in r]
    assert lrs[0] == pytest.approx(1e-2, rel=0.05) and lrs[-1] < 0.1 * lrs[0]  # the cosine ended at the new end


def test_steps_within_leaves_time_for_the_evaluations():
    from draftsmith.train.schedule import steps_within

    # 10 s left at 0.5 s a step, an evaluation of 1 s every 4 steps and one at the end: (10 - 1) / 0.75 = 12 steps
    assert steps_within(20, elapsed=10, step_seconds=0.5, eval_seconds=1.0, eval_every=4, done=5,
                        total_steps=100) == 17
    assert steps_within(20, elapsed=25, step_seconds=0.5, eval_seconds=0, eval_every=0, done=5, total_steps=100) == 5
    assert steps_within(1e6, elapsed=0, step_seconds=0.5, eval_seconds=0, eval_every=0, done=5, total_steps=50) == 50


def test_time_budget_refits_when_the_steps_speed_up(monkeypatch):
    """Steps of 2 s while the first ones are timed, then 1 s: the later fit lengthens the run (within its epochs), a
    step past the budget is the last, and evaluation time is not counted as step time."""
    import draftsmith.train.loop as loop
    from draftsmith.train.schedule import CALIBRATION_STEPS, REFIT_EVERY

    now = [0.0]
    monkeypatch.setattr(loop.time, "perf_counter", lambda: now[0])
    budget = loop.TimeBudget(max_seconds=300, clock=0.0, start_step=0, eval_seconds=0.0, eval_every=0)
    total, done = 1000, 0

    def step(seconds: float):
        nonlocal total, done
        now[0] += seconds
        done += 1
        fitted = budget.fit(done, total)
        total = fitted if fitted is not None else total

    step(5.0)  # warm-up: not timed
    for _ in range(CALIBRATION_STEPS):
        step(2.0)
    assert total == done + int((300 - now[0]) // 2.0)  # fitted at 2 s a step
    first = total
    budget.evaluated(10.0)  # an evaluation inside the timed stretch
    now[0] += 10.0
    while done < 1 + REFIT_EVERY:
        step(1.0)
    assert total > first and budget.step_seconds < 2.0  # faster steps: a longer run
    while done < total:
        step(1.0)
    assert now[0] <= 300 + 1.0
    over = loop.TimeBudget(max_seconds=10, clock=0.0, start_step=0, eval_seconds=0.0, eval_every=0, cap=1000)
    now[0] = 11.0
    assert over.fit(3, 1000) == 3  # past the budget: this step is the last
