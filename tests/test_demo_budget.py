"""`demo --budget`: the plan from measured rates (scripts/demo/budget.py), the ledger an interrupted demo resumes
from (scripts/demo/ledger.py), and the machine probe's choices (scripts/demo/machine.py)."""
from __future__ import annotations

import json
import time
from dataclasses import replace

import pytest

from draftsmith.demo.budget import (MIN_PROMPTS_PER_DOMAIN, MIN_TRAIN_SECONDS, RECORDING_OVERHEAD, BudgetError, Rates,
                                    Workload, data_seconds, least_budget, parse_budget, plan_demo, replan)
from draftsmith.serve.core.config import ConfigError

# what the probe measured for the demo target on the AVX2-only 2-core EPYC (fp32, 2 threads)
AVX2 = Rates(step_seconds=0.064, generate_tokens_per_second=237.0, prefill_tokens_per_second=461.0)
DEMO = Workload(prompts_per_domain=(64, 64, 64, 52, 64, 47, 57, 64, 64, 64, 64, 64, 64), prompt_tokens=72.7,
                answer_tokens=183.7, methods=("eagle3", "medusa"), method_weights=(0.75, 0.25), eval_prompts=26,
                eval_drafters=4, exports=4, export_tokens=96, generate_tokens=64)


def faster(rates: Rates, by: float) -> Rates:
    return Rates(step_seconds=rates.step_seconds / by, generate_tokens_per_second=rates.generate_tokens_per_second * by,
                 prefill_tokens_per_second=rates.prefill_tokens_per_second * by)


def test_budgets_parse_like_durations():
    assert parse_budget("30m") == 1800 and parse_budget("1h30m") == 5400 and parse_budget("90s") == 90
    assert parse_budget("45") == 2700 and parse_budget("1.5h") == 5400
    assert parse_budget("off") is None and parse_budget("0") is None
    with pytest.raises(ConfigError, match="give a duration like 30m"):
        parse_budget("thirty minutes")


def test_the_plan_fills_the_budget_and_no_more():
    plan = plan_demo(budget=1800, spent=20, rates=AVX2, work=DEMO)
    # the head given least trains first: what it leaves when it ends early goes to the next
    assert [s.name for s in plan.stages] == ["data", "train medusa", "train eagle3", "eval", "exports", "generate"]
    assert 1800 - 30 <= plan.total <= 1800
    data = plan.stage("data").settings
    assert MIN_PROMPTS_PER_DOMAIN < data["per_domain_limit"] < 64 and data["rows"] == DEMO.rows(
        data["per_domain_limit"])
    eagle, medusa = plan.stage("train eagle3"), plan.stage("train medusa")
    assert eagle.settings["max_seconds"] == pytest.approx(eagle.seconds, abs=1)
    # each head its least, the rest by weight
    assert eagle.seconds - MIN_TRAIN_SECONDS == pytest.approx((medusa.seconds - MIN_TRAIN_SECONDS) * 0.75 / 0.25)
    assert plan.stage("eval").seconds <= 0.25 * 1800
    table = plan.table()
    assert "plan for a 30.0 min budget" in table and "per_domain_limit" in table and "done at" in table


def test_a_faster_machine_spends_the_same_budget_on_more():
    slow, fast = (plan_demo(budget=1800, spent=20, rates=r, work=DEMO) for r in (AVX2, faster(AVX2, 2.5)))
    assert fast.stage("data").settings["rows"] > slow.stage("data").settings["rows"]
    fast_eval, slow_eval = fast.stage("eval").settings, slow.stage("eval").settings
    assert (fast_eval["max_new_tokens"] * fast_eval["repeats"] > slow_eval["max_new_tokens"] * slow_eval["repeats"])
    # every prompt answered: the time left over trains longer
    rich = plan_demo(budget=3 * 3600, spent=0, rates=AVX2, work=DEMO)
    assert rich.stage("data").settings["rows"] == sum(DEMO.prompts_per_domain)
    assert rich.stage("train eagle3").seconds > 3 * slow.stage("train eagle3").seconds


def test_a_budget_too_small_names_the_least_that_works():
    least = least_budget(DEMO, AVX2, spent=20)
    with pytest.raises(BudgetError, match=rf"too small for any training on this machine: the least that works is "
                                          rf"--budget {least / 60:.0f}m"):
        plan_demo(budget=least - 120, spent=20, rates=AVX2, work=DEMO)
    plan = plan_demo(budget=least, spent=20, rates=AVX2, work=DEMO)  # the least itself plans
    assert plan.stage("data").settings["per_domain_limit"] >= MIN_PROMPTS_PER_DOMAIN
    assert all(plan.stage(f"train {m}").seconds >= MIN_TRAIN_SECONDS for m in DEMO.methods)
    assert least_budget(DEMO, faster(AVX2, 3)) < least


def test_a_slower_stage_shrinks_training_and_says_so():
    plan = plan_demo(budget=1800, spent=20, rates=AVX2, work=DEMO)
    data = plan.stage("data")
    later, slowdown, note = replan(plan, done={"data": 1.3 * data.seconds}, spent=20 + 1.3 * data.seconds,
                                   rates=AVX2, work=DEMO)
    assert slowdown == pytest.approx(1.3)
    assert later.stage("data") is None and later.stage("exports").seconds == pytest.approx(
        1.3 * plan.stage("exports").seconds)
    assert later.stage("train eagle3").seconds < plan.stage("train eagle3").seconds
    assert "ran 1.30x their planned time (a busier machine, or a stage slower" in note
    assert 1800 - 30 <= later.total <= 1800 + 1
    # much slower: the evaluation shrinks before training falls under its least, and past that the note says so
    slower, _, _ = replan(plan, done={"data": 1.5 * data.seconds}, spent=20 + 1.5 * data.seconds, rates=AVX2,
                          work=DEMO)
    assert slower.stage("eval").settings["max_new_tokens"] < plan.stage("eval").settings["max_new_tokens"]
    assert all(slower.stage(f"train {m}").seconds >= MIN_TRAIN_SECONDS for m in DEMO.methods)
    _, _, late = replan(plan, done={"data": 2.5 * data.seconds}, spent=20 + 2.5 * data.seconds, rates=AVX2,
                        work=DEMO)
    assert "end" in late and "past the budget" in late
    # on time: the plan holds; a head that stopped early (its epochs, or early stopping) leaves its time to the next
    on_time, _, quiet = replan(plan, done={"data": data.seconds}, spent=20 + data.seconds, rates=AVX2, work=DEMO)
    assert quiet is None and on_time.stage("train eagle3").seconds == pytest.approx(
        plan.stage("train eagle3").seconds, rel=0.02)
    spent = 20 + data.seconds + 30
    after, _, _ = replan(plan, done={"data": data.seconds, "train medusa": 30.0}, spent=spent, rates=AVX2, work=DEMO)
    assert after.stage("train eagle3").seconds > plan.stage("train eagle3").seconds + 0.9 * (
        plan.stage("train medusa").seconds - 30)
    assert after.total == pytest.approx(1800, abs=1)


def test_the_offline_data_stage_pays_for_recording_the_states():
    """Offline, `data build --capture` records the hidden states as it answers: the data stage costs
    RECORDING_OVERHEAD times the online one's for the same rows, and no capture stage follows it."""
    online = replace(DEMO, records_states=False)
    rows = DEMO.rows(20)
    assert DEMO.records_states and RECORDING_OVERHEAD > 1
    assert data_seconds(rows, DEMO, AVX2) == pytest.approx(RECORDING_OVERHEAD * data_seconds(rows, online, AVX2))
    offline_plan, online_plan = (plan_demo(budget=1800, spent=20, rates=AVX2, work=w, per_domain=20)
                                 for w in (DEMO, online))
    assert offline_plan.stage("data").seconds == pytest.approx(
        RECORDING_OVERHEAD * online_plan.stage("data").seconds)
    assert offline_plan.stage("capture") is None and offline_plan.total == pytest.approx(online_plan.total, abs=1)
    # the recording's seconds come out of training, not out of the budget
    assert offline_plan.stage("train eagle3").seconds < online_plan.stage("train eagle3").seconds


def test_self_distillation_stops_starting_rows_when_the_rows_in_flight_need_the_rest(tmp_path):
    from draftsmith.demo.budget import drain_seconds
    from draftsmith.demo.pacer import Pacer

    work = replace(DEMO, batch_rows=64, turn_tokens=150.0)
    pacer = Pacer.start(tmp_path, 1800, AVX2, work, log=lambda _: None)
    planned, drain = pacer.plan.stage("data").seconds, drain_seconds(work, AVX2)
    # the rows in flight end within the plan: started until the plan's end less their drain
    assert 0 < drain < planned and pacer.deadline_seconds() == pytest.approx(planned - drain)
    # a longer answer needs a longer drain; never less than half the planned time to start rows
    longer = Pacer.start(tmp_path / "b", 1800, AVX2, replace(work, turn_tokens=1e5), log=lambda _: None)
    assert longer.deadline_seconds() == pytest.approx(0.5 * longer.plan.stage("data").seconds)
    pacer.ledger._stop.set()
    longer.ledger._stop.set()


def test_an_interrupted_demo_keeps_its_data_and_what_is_left(tmp_path, monkeypatch):
    import draftsmith.demo.ledger as ledger_module
    from draftsmith.demo.ledger import BudgetLedger
    from draftsmith.demo.pacer import Pacer

    monkeypatch.setattr(ledger_module, "HEARTBEAT_SECONDS", 0.05)
    lines: list[str] = []
    first = Pacer.start(tmp_path, 1800, AVX2, DEMO, log=lines.append)
    per_domain = first.before("data")["per_domain_limit"]
    time.sleep(0.3)  # killed here: no stage recorded, only the heartbeat's count
    first.ledger._stop.set()
    saved = json.loads((tmp_path / "budget.json").read_text())
    assert saved["spent"] >= 0.2 and not saved["finished"] and saved["decisions"]["per_domain_limit"] == per_domain

    faster_now = faster(AVX2, 2.0)  # a rerun measures a faster machine: the data it planned is kept
    second = Pacer.start(tmp_path, 1800, faster_now, DEMO, log=lines.append)
    assert second.ledger.resumed and second.ledger.spent >= saved["spent"]
    assert second.before("data")["per_domain_limit"] == per_domain and second.plan.spent >= saved["spent"]
    assert any("resuming:" in line and "1 earlier run;" in line for line in lines)
    assert second.deadline_seconds() > 0  # its data was not built yet
    plan = second.plan
    second.after("data", plan.stage("data").seconds)
    second.after("train medusa", 50.0)
    second.ledger._stop.set()  # killed in EAGLE-3's training

    lines.clear()
    third = Pacer.start(tmp_path, 1800, AVX2, DEMO, log=lines.append)  # the third run: two stages are done
    assert third.earlier == {"data", "train medusa"}
    assert [s.name for s in third.plan.stages] == ["train eagle3", "eval", "exports", "generate"]
    assert third.plan.total == pytest.approx(1800, abs=2)  # EAGLE-3 gets what is left
    assert "reused: data, train medusa" in "\n".join(lines)
    assert third.planned_seconds("data") is None  # reused: no plan to keep to
    third.after("data", 0.5, reused=True)
    third.after("train medusa", 0.1, reused=True)
    assert third.slowdown == 1.0 and third.plan.stage("train eagle3").seconds == pytest.approx(
        1800 - third.ledger.spent - sum(s.seconds for s in third.plan.stages[1:]), abs=2)
    summary = third.finish()
    assert summary["runs"] == 3 and summary["stages"]["train medusa"]["real"] == 50.0
    # a finished demo run again: a new count, the same decisions, everything reused
    fresh = BudgetLedger(tmp_path, 1800)
    assert not fresh.resumed and fresh.decisions["per_domain_limit"] == per_domain and fresh.runs == 1
    rerun = Pacer.start(tmp_path, 1800, AVX2, DEMO, log=lines.append)
    assert rerun.deadline_seconds() == 0.0  # its data was built: a rerun starts no new prompt, and reuses the rest
    rerun.after("data", 0.5, reused=True)
    assert rerun.slowdown == 1.0 and not rerun.notes  # a reused stage says nothing of the machine's speed
    rerun.ledger._stop.set()
    assert BudgetLedger(tmp_path, 3600).decisions == {}  # another budget plans anew


def test_the_probe_picks_bf16_only_where_it_is_faster():
    from draftsmith.demo.machine import choose

    avx2 = {"float32": {1: 88.0, 2: 167.0}, "bfloat16": {1: 1.3, 2: 1.2}}
    dtype, threads, why = choose(avx2, idle=2.0, usable=2)
    assert (dtype, threads) == ("float32", 2) and "fp32 matmul 167 GFLOP/s against bf16 1.3" in why
    amx = {"float32": {1: 150.0, 2: 290.0}, "bfloat16": {1: 900.0, 2: 1700.0}}
    assert choose(amx, idle=2.0, usable=2)[:2] == ("bfloat16", 2)
    # one core busy elsewhere: one thread, whatever two would have done on a quiet machine
    assert choose(avx2, idle=1.1, usable=2)[1] == 1
    # two threads no faster than one (a shared core): the fewer
    assert choose({"float32": {1: 100.0, 2: 104.0}}, idle=2.0, usable=2)[1] == 1
    assert choose(amx, idle=2.0, usable=2, requested_dtype="float32", requested_threads=1)[:2] == ("float32", 1)


def test_the_probe_measures_this_machine_and_a_target(tiny_target):
    import torch

    from draftsmith.demo.machine import MachineReport, probe_hardware, probe_target
    from draftsmith.demo.pacer import rates_of

    threads = torch.get_num_threads()
    hardware = probe_hardware(dtypes=("float32",))
    assert torch.get_num_threads() == threads  # measuring does not change torch's threads
    assert hardware.gflops["float32"][1] > 0 and hardware.dtype == "float32" and hardware.threads >= 1
    rates = probe_target(tiny_target, batch=4, prefill_tokens=256, window=80)
    assert rates.step_seconds > 0 and rates.generate_tokens_per_second > 0 and rates.prefill_tokens == 256
    # the plan reads the step over the workload's window (rates_of), the goal's share the 64-token step
    assert rates.window == 80 and rates.window_tokens_per_second == 4 / rates.window_step_seconds
    assert rates_of(rates).generate_tokens_per_second == rates.window_tokens_per_second
    short = probe_target(tiny_target, batch=2, prefill_tokens=64, window=64)  # no longer than the 64-token step
    assert short.window == 0 and short.window_tokens_per_second == short.generate_tokens_per_second
    lines = MachineReport(hardware, rates).lines()
    assert lines[0].startswith("machine: ") and lines[-1].startswith("target: one decode step")
    assert ", over 80 tokens " in lines[-1]
    # the batched step's linears against the matmul the probe measured (the share #65's goal reads)
    linears = 2 * sum(m.weight.numel() for m in tiny_target.model.modules() if isinstance(m, torch.nn.Linear))
    assert rates.batch_step_flops == 4 * linears
    peak = hardware.gflops["float32"][rates.threads] if rates.threads in hardware.gflops["float32"] else None
    assert (" GFLOP at " in lines[-1] and "% of the float32 matmul's" in lines[-1]) == bool(peak)
    assert json.dumps(MachineReport(hardware, rates).to_dict())


def test_the_demo_refuses_a_budget_too_small_before_any_work(tiny_target_dir, tmp_path, capsys):
    """`draftsmith demo --budget 1m`: one line naming the least budget that works on this machine, exit 2, and
    nothing self-distilled."""
    from draftsmith.cli import main

    out = tmp_path / "demo"
    with pytest.raises(SystemExit) as exit_:
        main(["demo", "--budget", "1m", "--out", str(out), "--threads", "1", f"target.spec={tiny_target_dir}",
              "domains=[code,math]"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and ("error: a 60 s budget is too small for any training on this machine: the least "
                                      "that works is --budget ") in err
    assert not (out / "data").exists()


def test_every_replan_scales_the_first_predictions_by_all_that_finished():
    """Data 1.2x slower, then the evaluation 0.76x: the rest is scaled by both together, not by the last stage alone
    nor twice over."""
    plan = plan_demo(budget=1800, spent=20, rates=AVX2, work=DEMO)
    d, e = plan.stage("data").seconds, plan.stage("eval").seconds
    trained = sum(plan.stage(f"train {m}").seconds for m in DEMO.methods)
    done = {"data": 1.2 * d, **{f"train {m}": plan.stage(f"train {m}").seconds for m in DEMO.methods}, "eval": 0.76 * e}
    later, slowdown, _ = replan(plan, done=done, spent=20 + 1.2 * d + trained + 0.76 * e, rates=AVX2, work=DEMO)
    both = (1.2 * d + 0.76 * e) / (d + e)
    assert slowdown == pytest.approx(both) and abs(both - 1.2) > 0.05 and abs(both - 0.76) > 0.05
    assert later.stage("exports").seconds == pytest.approx(plan.stage("exports").seconds * both)
    assert later.stage("generate").seconds == pytest.approx(plan.stage("generate").seconds * both)


def test_a_resume_with_little_left_plans_what_is_left(tmp_path):
    """Killed late in a tight budget: the least budget counts only the stages still to do, so the rerun goes on
    with what is left instead of refusing."""
    from draftsmith.demo.pacer import Pacer

    budget = 900.0
    done = {"data": {"planned": 324.0, "real": 340.0}, "train medusa": {"planned": 94.0, "real": 49.0}}
    (tmp_path / "budget.json").write_text(json.dumps({
        "budget": budget, "spent": 450.0, "runs": 1, "finished": False, "stages": done,
        "decisions": {"per_domain_limit": 14, "eval": [32, 1], "data_built": True}}))
    with pytest.raises(BudgetError):  # as a fresh start, 450 s could not hold the data again
        plan_demo(budget=budget, spent=450.0, rates=AVX2, work=DEMO, per_domain=14, eval_choice=(32, 1))
    pacer = Pacer.start(tmp_path, budget, AVX2, DEMO, log=lambda _: None)
    assert [s.name for s in pacer.plan.stages] == ["train eagle3", "eval", "exports", "generate"]
    assert pacer.plan.stage("train eagle3").seconds >= MIN_TRAIN_SECONDS
    assert pacer.decisions["per_domain_limit"] == 14 and pacer.decisions["eval"] == [32, 1]  # what the demo is told
    assert pacer.before("data") == {}  # no longer planned: the demo reads the decisions
    assert pacer.training_order(["eagle3", "medusa"]) == ["medusa", "eagle3"]  # medusa reused: it goes first
    pacer.ledger._stop.set()
    # on a machine gone 3x slower, what is left cannot hold the least: the resumed demo goes on past its budget
    lines: list[str] = []
    slow = Pacer.start(tmp_path, budget, faster(AVX2, 1 / 3), DEMO, log=lines.append)
    assert slow.plan.total > budget and slow.plan.stage("train eagle3").seconds >= MIN_TRAIN_SECONDS
    assert any("ends about" in line and "past it" in line for line in lines)
    slow.ledger._stop.set()


def test_every_prompt_fitting_gives_the_data_stage_its_slack():
    """Where the room holds every prompt, the data stage is planned DATA_SLACK past its prediction (a build a little
    slower than predicted still starts every row); where it does not, the prediction fills the room."""
    from draftsmith.demo.budget import DATA_SLACK

    rich = plan_demo(budget=3 * 3600, spent=0, rates=AVX2, work=DEMO)
    rows = rich.stage("data").settings["rows"]
    assert rows == sum(DEMO.prompts_per_domain)
    assert rich.stage("data").seconds == pytest.approx(DATA_SLACK * data_seconds(rows, DEMO, AVX2))
    tight = plan_demo(budget=1800, spent=20, rates=AVX2, work=DEMO)
    assert tight.stage("data").seconds == pytest.approx(data_seconds(tight.stage("data").settings["rows"], DEMO, AVX2))


def test_heads_train_in_bf16_where_the_probe_chose_a_bf16_target():
    from draftsmith.demo.run import training_precision

    assert training_precision("auto", "bfloat16") == "bf16"
    assert training_precision("auto", "float32") == "auto"  # fp32 on a CPU, bf16 on a GPU (train/config.py)
    assert training_precision("fp32", "bfloat16") == "fp32"  # the recipe's own choice stands


def test_a_data_stage_done_early_moves_no_prediction():
    """Every row answered before the data stage's planned end (its plan is a ceiling): the evaluation keeps its
    prediction and training gets the time left, where a faster stage would have scaled the rest down."""
    plan = plan_demo(budget=1800, spent=20, rates=AVX2, work=DEMO)
    data = plan.stage("data")
    early, slowdown, _ = replan(plan, done={"data": 0.8 * data.seconds}, spent=20 + 0.8 * data.seconds, rates=AVX2,
                                work=DEMO)
    assert slowdown == 1.0 and early.stage("eval").seconds == pytest.approx(plan.stage("eval").seconds)
    assert early.stage("train eagle3").seconds > plan.stage("train eagle3").seconds
    assert early.total == pytest.approx(1800, abs=1)
