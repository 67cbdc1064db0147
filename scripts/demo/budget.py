"""The demo's stages sized to a wall-clock budget (`draftsmith demo --budget 30m`), from the machine's measured
rates (scripts/demo/machine.py). Pure functions: no clock, no model.

Two stages are elastic, the budget decides their size: self-distillation (how many prompts per domain the target
answers; offline, the forwards that write the answers also record the hidden-state cache, so no capture stage
follows) and training (seconds per head, `optim.max_seconds`: the loop fits its steps and learning-rate schedule
into them). The others are predicted from the rates: the evaluation (sized first, to at most EVAL_SHARE of the
budget), the exports and the live generation. After every stage the rest is planned again from what is left of the
budget and how much slower or faster the finished stages ran than predicted.

    plan = plan_demo(budget_seconds=1800, spent=40, rates=rates, work=workload)
    print(plan.table())
"""
from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field, replace

from draftsmith.serve.core.errors import ConfigError, DraftsmithError

# ---- the cost model's constants (measured on the demo target; docs/results.md "The demo on a budget")
GENERATION_SLOWDOWN = 1.5  # continuous batching against the probe's step of the same decoder over the workload's
                           # window (prompt + one answer): rows draining, newcomers' prefills stalling the others,
                           # conversations' later turns over longer windows, the parts written. Measured in four full
                           # demos on the AVX512-BF16 EPYC: 1.44-1.53 (a build of first turns alone: 1.20). Set
                           # high rather than low: a data stage that ends early gives its time to training, one
                           # predicted short leaves rows unanswered at its deadline.
DATA_SLACK = 1.1  # where every prompt fits, the data stage may run this much past its prediction (then no row is
                  # left unstarted by a build a little slower than predicted; what it leaves goes to training)
RECORDING_OVERHEAD = 1.08  # data build --capture: the states kept per step, the closing step of each row, the
                           # parts' states files and the cache assembled from them
DRAIN_SHARE = 0.6  # of a full batch's steps over one answer, for the rows in flight to end after the deadline
DRAFTER_PASS = 0.85  # an evaluated drafter's time per prompt against plain decoding's
EVAL_FIXED_SECONDS = 25.0  # verify-cost measurement and warm-up runs
EXPORT_FIXED_SECONDS = 4.0  # writing and reading back one export, besides its check's decoding
TRAIN_SHARE = 0.45  # of the elastic seconds, for training (the rest: self-distillation)
EVAL_SHARE = 0.25  # the evaluation takes at most this share of the budget
EVAL_CHOICES = ((96, 2), (64, 2), (96, 1), (64, 1), (48, 1), (32, 1))  # (new tokens, repeats), best first
MIN_PROMPTS_PER_DOMAIN = 4  # less data than this trains nothing worth measuring
MIN_TRAIN_SECONDS = 60.0  # per head
SLOW = 1.2  # a stage this much slower than planned re-plans the rest and says so
MIN_EVIDENCE_SECONDS = 60.0  # predicted stages shorter than this in all do not move the predictions


class BudgetError(DraftsmithError):
    """A budget that cannot hold the demo: says the least that works on this machine."""


def parse_budget(text: str) -> float | None:
    """'30m', '1h', '90s', '45' (minutes), '1h30m' -> seconds; 'off' / 'none' / '0' -> None (the recipe as written)."""
    value = str(text).strip().lower()
    if value in ("off", "none", "0", ""):
        return None
    if re.fullmatch(r"\d+(\.\d+)?", value):
        return float(value) * 60
    parts = re.fullmatch(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m(?:in)?)?(?:(\d+(?:\.\d+)?)s)?", value)
    if not parts or not any(parts.groups()):
        raise ConfigError(f"--budget {text!r}: give a duration like 30m, 1h, 1h30m or 900s (or off)")
    hours, minutes, seconds = (float(p) if p else 0.0 for p in parts.groups())
    return hours * 3600 + minutes * 60 + seconds


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 90 else f"{seconds:.0f} s"


@dataclass(frozen=True)
class Rates:
    """What the probe measured (draftsmith.demo.machine.TargetRates), in the units the plan needs."""
    step_seconds: float  # one plain decode step of one row
    generate_tokens_per_second: float  # batched self-distillation, data.batch_size rows over the workload's window
    prefill_tokens_per_second: float  # reading the prompts


@dataclass(frozen=True)
class Workload:
    """What the recipe asks for, at most (configs/demo/full.yaml)."""
    prompts_per_domain: tuple[int, ...]  # training prompts each domain has
    prompt_tokens: float  # mean tokens of a training prompt as the target reads it (chat template included)
    answer_tokens: float  # expected tokens per answer (max_new_tokens x the share that is written before EOS)
    methods: tuple[str, ...]  # heads to train
    method_weights: tuple[float, ...]  # their shares of the training seconds
    eval_prompts: int
    eval_drafters: int  # drafters evaluated beside plain decoding
    exports: int
    export_tokens: int  # tokens decoded per export check (prompts x tokens, native and read back)
    generate_tokens: int
    records_states: bool = True  # the offline demo's data build writes the hidden-state cache; the online one does not
    batch_rows: int = 64  # rows self-distillation decodes at once (data.batch_size: the probe's batched step)
    turn_tokens: float = 0.0  # expected tokens of one answer (max_new_tokens x the share written before EOS)

    def rows(self, per_domain: int) -> int:
        return sum(min(n, per_domain) for n in self.prompts_per_domain)


@dataclass(frozen=True)
class StagePlan:
    name: str
    seconds: float  # planned
    settings: dict = field(default_factory=dict)  # what the stage is told: per_domain_limit, max_seconds, ...
    elastic: bool = False  # sized by the budget (True) or predicted from the rates


@dataclass(frozen=True)
class Plan:
    budget: float
    spent: float  # seconds already spent (earlier runs of an interrupted demo, the probe, the target load)
    stages: tuple[StagePlan, ...]
    notes: tuple[str, ...] = ()

    def stage(self, name: str) -> StagePlan | None:
        return next((s for s in self.stages if s.name == name), None)

    @property
    def total(self) -> float:
        return self.spent + sum(s.seconds for s in self.stages)

    def table(self) -> str:
        lines = [f"plan for a {minutes(self.budget)} budget ({minutes(self.spent)} spent so far):"]
        eta = self.spent
        for s in self.stages:
            eta += s.seconds
            what = ", ".join(f"{k} {v}" for k, v in s.settings.items())
            lines.append(f"  {s.name:<22} {minutes(s.seconds):>9}  (done at {minutes(eta):>8})  {what}")
        return "\n".join(lines + [f"  note: {n}" for n in self.notes])

    def to_dict(self) -> dict:
        return {"budget": self.budget, "spent": round(self.spent, 1), "notes": list(self.notes),
                "stages": [{**asdict(s), "seconds": round(s.seconds, 1)} for s in self.stages]}


# ----------------------------------------------------------------------------------------------- predictions

def data_seconds(rows: int, work: Workload, rates: Rates) -> float:
    generate = rows * work.answer_tokens / rates.generate_tokens_per_second * GENERATION_SLOWDOWN
    seconds = generate + rows * work.prompt_tokens / rates.prefill_tokens_per_second
    return seconds * RECORDING_OVERHEAD if work.records_states else seconds


def drain_seconds(work: Workload, rates: Rates) -> float:
    """How long the rows in flight take to end their answer once self-distillation starts no new row (its
    deadline): about one answer of steps of the whole batch, cheaper as rows leave (DRAIN_SHARE)."""
    step = work.batch_rows / rates.generate_tokens_per_second * GENERATION_SLOWDOWN
    return work.turn_tokens * step * DRAIN_SHARE


def eval_seconds(new_tokens: int, repeats: int, work: Workload, rates: Rates) -> float:
    passes = 1 + DRAFTER_PASS * work.eval_drafters
    return work.eval_prompts * new_tokens * rates.step_seconds * passes * repeats + EVAL_FIXED_SECONDS


def export_seconds(work: Workload, rates: Rates) -> float:
    return work.exports * (EXPORT_FIXED_SECONDS + 2 * work.export_tokens * rates.step_seconds)


def generate_seconds(work: Workload, rates: Rates) -> float:
    return 2.0 + work.generate_tokens * rates.step_seconds


# ----------------------------------------------------------------------------------------------- the plan

def choose_eval(budget: float, work: Workload, rates: Rates) -> tuple[int, int]:
    """(new tokens, repeats) of the largest evaluation within EVAL_SHARE of the budget (the smallest otherwise)."""
    for tokens, repeats in EVAL_CHOICES:
        if eval_seconds(tokens, repeats, work, rates) <= EVAL_SHARE * budget:
            return tokens, repeats
    return EVAL_CHOICES[-1]


def least_budget(work: Workload, rates: Rates, *, spent: float = 0.0, finished: frozenset[str] = frozenset()) -> float:
    """The smallest budget that trains every head on MIN_PROMPTS_PER_DOMAIN prompts per domain; `finished`: stages
    an earlier run of an interrupted demo did (their seconds are in `spent`)."""
    rows = work.rows(min(MIN_PROMPTS_PER_DOMAIN, max(work.prompts_per_domain)))
    tokens, repeats = EVAL_CHOICES[-1]
    least = {"data": data_seconds(rows, work, rates),
             **{f"train {m}": MIN_TRAIN_SECONDS for m in work.methods},
             "eval": eval_seconds(tokens, repeats, work, rates), "exports": export_seconds(work, rates),
             "generate": generate_seconds(work, rates)}
    return 60 * math.ceil((spent + sum(v for k, v in least.items() if k not in finished)) / 60)


def split_training(seconds: float, weights) -> list[float]:
    """Each head's seconds: MIN_TRAIN_SECONDS each, the rest of `seconds` shared by weight."""
    spare = max(0.0, seconds - MIN_TRAIN_SECONDS * len(weights))
    return [MIN_TRAIN_SECONDS + spare * w / sum(weights) for w in weights]


def plan_demo(*, budget: float, spent: float, rates: Rates, work: Workload, per_domain: int | None = None,
              eval_choice: tuple[int, int] | None = None, finished: frozenset[str] = frozenset(),
              refuse: bool = True) -> Plan:
    """The stages from the data on, sized so that the whole demo ends within `budget` seconds.

    per_domain: prompts per domain fixed by an earlier run (an interrupted demo keeps its data); eval_choice
    likewise; finished: the stages that run did (the plan still lists them: see replan). Raises BudgetError when even
    the least data and training do not fit, naming the least budget that works; refuse=False (a resumed demo, whose
    decisions a new budget would drop) plans the least instead, past the budget.
    """
    tokens, repeats = eval_choice or choose_eval(budget, work, rates)
    fixed = [StagePlan("eval", eval_seconds(tokens, repeats, work, rates),
                       {"max_new_tokens": tokens, "repeats": repeats}),
             StagePlan("exports", export_seconds(work, rates), {"exports": work.exports}),
             StagePlan("generate", generate_seconds(work, rates))]
    elastic = budget - spent - sum(s.seconds for s in fixed)
    least = least_budget(work, rates, spent=spent, finished=finished)
    if budget < least and refuse:
        raise BudgetError(f"a {minutes(budget)} budget is too small for any training on this machine: the least "
                          f"that works is --budget {least / 60:.0f}m ({MIN_PROMPTS_PER_DOMAIN} prompts per domain, "
                          f"{MIN_TRAIN_SECONDS:.0f} s per head"
                          + (f", {minutes(spent)} already spent" if spent else "") + ")")

    most = max(work.prompts_per_domain)  # the recipe's own limit: never more
    room = min(elastic * (1 - TRAIN_SHARE), elastic - MIN_TRAIN_SECONDS * len(work.methods))  # the data's most
    if per_domain is None:
        fewest = min(MIN_PROMPTS_PER_DOMAIN, most)
        fits = [p for p in range(fewest, most + 1) if data_seconds(work.rows(p), work, rates) <= room]
        per_domain = max(fits, default=fewest)
    per_domain = min(per_domain, most)
    data_rows = work.rows(per_domain)
    predicted = data_seconds(data_rows, work, rates)
    if per_domain == most:  # every prompt: the room to spare, up to DATA_SLACK of the prediction
        predicted = max(predicted, min(DATA_SLACK * predicted, room))
    data = StagePlan("data", predicted, {"per_domain_limit": per_domain, "rows": data_rows}, elastic=True)
    seconds = split_training(elastic - data.seconds, work.method_weights)
    trains = sorted((StagePlan(f"train {m}", t, {"max_seconds": round(t)}, elastic=True)
                     for m, t in zip(work.methods, seconds)), key=lambda s: s.seconds)  # least first: see Pacer
    return Plan(budget=budget, spent=spent, stages=(data, *trains, *fixed))


def replan(plan: Plan, *, done: dict[str, float], spent: float, rates: Rates,
           work: Workload) -> tuple[Plan, float, str | None]:
    """The stages not done yet, sized again to what is left of the budget. `plan`: the first plan (its
    predictions); done: every finished stage's real seconds. Predicted stages are scaled by how much slower (or
    faster) the finished ones ran than predicted, training gets whatever remains (at least MIN_TRAIN_SECONDS a
    head, even past the budget). Returns (plan, slowdown, a note when it changed course)."""
    predicted = [s for s in plan.stages if s.name in done and not s.name.startswith("train ") and s.seconds > 0]
    planned = sum(s.seconds for s in predicted)
    # An elastic stage (the data) planned up to its prediction and past it (DATA_SLACK) ends early once every row is
    # answered: that says nothing of a faster machine, only a longer one does. Too short a stretch says more about
    # start-up costs than about the machine.
    real = sum(max(done[s.name], s.seconds) if s.elastic else done[s.name] for s in predicted)
    slowdown = real / planned if planned >= MIN_EVIDENCE_SECONDS else 1.0
    slowdown = min(max(slowdown, 0.5), 4.0)
    left = [s for s in plan.stages if s.name not in done]
    fixed = [replace(s, seconds=s.seconds * slowdown) for s in left if not s.elastic]
    trains = [s for s in left if s.elastic and s.name.startswith("train ")]
    room = plan.budget - spent - sum(s.seconds for s in fixed)
    evaluation = next((s for s in fixed if s.name == "eval"), None)
    # training kept to at least half its planned time (and MIN_TRAIN_SECONDS a head) by a smaller evaluation
    wanted = max(MIN_TRAIN_SECONDS * len(trains), 0.5 * sum(s.seconds for s in trains))
    if evaluation is not None and trains and room < wanted:
        slower = replace(rates, step_seconds=rates.step_seconds * slowdown)
        current = (evaluation.settings["max_new_tokens"], evaluation.settings["repeats"])
        for tokens, repeats in EVAL_CHOICES[EVAL_CHOICES.index(current) + 1:] if current in EVAL_CHOICES else ():
            smaller = replace(evaluation, seconds=eval_seconds(tokens, repeats, work, slower),
                              settings={"max_new_tokens": tokens, "repeats": repeats})
            room += evaluation.seconds - smaller.seconds
            fixed = [smaller if s.name == "eval" else s for s in fixed]
            evaluation = smaller
            if room >= wanted:
                break
    weights = {s.name: max(s.seconds - MIN_TRAIN_SECONDS, 1.0) for s in trains}  # their shares above the least
    total_weight = sum(weights.values()) or 1.0
    resized = dict(zip(weights, split_training(room, [weights[s.name] / total_weight for s in trains])))
    stages = tuple(replace(s, seconds=resized[s.name], settings={**s.settings, "max_seconds": round(resized[s.name])})
                   if s.name in resized else next(f for f in fixed if f.name == s.name) for s in left)
    new = Plan(budget=plan.budget, spent=spent, stages=stages, notes=plan.notes)
    note = None
    if new.total > plan.budget + 1:
        note = (f"the finished stages ran {slowdown:.2f}x their planned time: even the least training and the "
                f"smallest evaluation end {minutes(new.total - plan.budget)} past the budget")
    elif slowdown > SLOW and trains:
        note = (f"the finished stages ran {slowdown:.2f}x their planned time (a busier machine, or a stage slower "
                f"than the probe predicted): training re-planned to "
                + ", ".join(f"{s.name.split()[1]} {minutes(resized[s.name])}" for s in trains))
    elif trains and sum(resized.values()) > 1.25 * sum(s.seconds for s in trains):
        note = (f"the finished stages ran {slowdown:.2f}x their planned time: training gets the time they left, "
                + ", ".join(f"{s.name.split()[1]} {minutes(resized[s.name])}" for s in trains))
    return new, slowdown, note
