"""`demo --budget`: keeps the demo's stages to the plan of scripts/demo/budget.py. Before a stage it says what the
stage is given (prompts per domain, a head's seconds, the evaluation's size); after it, it records the planned
and real seconds in the ledger (scripts/demo/ledger.py) and plans the rest again from what is left.

    pacer = Pacer.start(out, budget_seconds, rates, workload, log=print)   # prints the plan with each ETA
    given = pacer.before("data")       # {"per_domain_limit": 40, "rows": 520, ...}
    ...
    pacer.after("data", seconds)
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, TYPE_CHECKING

from draftsmith.demo.budget import Plan, Rates, Workload, drain_seconds, minutes, plan_demo, replan
from draftsmith.demo.ledger import BudgetLedger
from draftsmith.serve.methods.registry import method as method_of

if TYPE_CHECKING:  # annotations only: the target's module imports torch
    from draftsmith.serve.core.target import Target

ANSWER_SHARE = 0.7  # of max_new_tokens, written before EOS on average (the demo target on the built-in prompts: 181
                    # of 256 tokens over 384 of them in bf16)
# self-distillation stops starting rows when what is left of its planned time is what the rows in flight need to end
# (budget.drain_seconds), but never before this share of it
EARLIEST_DEADLINE = 0.5


def workload_of(config: Any, target: Target, train_prompts: Path) -> Workload:
    """What the demo recipe asks for, with its prompts measured in the target's tokens."""
    from draftsmith.data.builtin import BUILTIN_DOMAINS
    from draftsmith.data.masks import render_prompt

    rows = [json.loads(line) for line in train_prompts.read_text().splitlines() if line.strip()]
    domains = list(config.domains or BUILTIN_DOMAINS)
    limit = config.data.per_domain_limit or len(rows)
    per_domain = tuple(min(limit, sum(r["domain"] == d for r in rows)) for d in domains)
    chat = config.data.chat
    lengths, turns = [], []
    for row in rows:
        first = row.get("turns", [row.get("prompt") or ""])[0] if "messages" not in row else None
        messages = row["messages"][:1] if first is None else [{"role": "user", "content": first}]
        lengths.append(len(render_prompt(target.tokenizer, messages, chat=chat)))
        turns.append(len(row.get("turns", [])) or sum(m.get("role") == "user" for m in row.get("messages", [])) or 1)
    mean_turns = sum(turns) / len(turns)
    held_out = min(config.eval.per_domain_limit or config.eval_prompts_per_domain, config.eval_prompts_per_domain)
    answer = config.data.max_new_tokens * ANSWER_SHARE * mean_turns
    methods = tuple(config.methods)
    # a head with a decoder layer (EAGLE) trains at about three times the cost of one without (Medusa) at this scale
    weights = tuple(0.75 if method_of(m).llama_layer else 0.25 for m in methods)
    drafters = len(methods) + 1 + (1 if methods else 0)  # the heads, n-gram, the hybrid
    exports = sum(_exportable(config, m, fmt) for m in methods for fmt in config.export_formats)
    return Workload(prompts_per_domain=per_domain, prompt_tokens=sum(lengths) / len(lengths),
                    # a later turn's prompt is written into the row too
                    answer_tokens=answer + (mean_turns - 1) * sum(lengths) / len(lengths), methods=methods,
                    method_weights=weights, eval_prompts=len(domains) * held_out,
                    eval_drafters=drafters, exports=exports,
                    export_tokens=config.export_check_prompts * config.export_check_tokens,
                    generate_tokens=config.generate_max_new_tokens,
                    # offline, `data build --capture` records the states the heads train from as it answers
                    records_states=config.train_mode == "offline", batch_rows=config.data.batch_size,
                    turn_tokens=config.data.max_new_tokens * ANSWER_SHARE)


def _exportable(config: Any, method: str, fmt: str) -> bool:
    """Whether the export will be written (serve/export refuses the others before any work): the method has a form
    in `fmt`, and one loaded with the full vocabulary only (vLLM's Medusa) is not given a reduced one."""
    form = method_of(method).exports.get(fmt)
    return form is not None and not (form.full_vocab_only and getattr(config, method).model.draft_vocab_size)


def rates_of(measured: Any) -> Rates:
    return Rates(step_seconds=measured.step_seconds, generate_tokens_per_second=measured.window_tokens_per_second,
                 prefill_tokens_per_second=measured.prefill_tokens_per_second)


class Pacer:
    """The plan kept across the stages; `Pacer.off()` when the demo runs its recipe as written."""

    def __init__(self, ledger: BudgetLedger | None, plan: Plan | None, rates: Rates | None, work: Workload | None,
                 log: Callable[[str], None]):
        self.ledger, self.plan, self.rates, self.work, self.log = ledger, plan, rates, work, log
        self.first = plan  # as printed at the start: what every re-plan scales
        self.earlier: set[str] = set()  # stages an earlier run of an interrupted demo finished
        self.done: dict[str, float] = {}
        self.planned: dict[str, float] = {s.name: s.seconds for s in plan.stages} if plan else {}
        self.notes: list[str] = []
        self.slowdown = 1.0

    @classmethod
    def off(cls, log: Callable[[str], None] = print) -> "Pacer":
        return cls(None, None, None, None, log)

    @classmethod
    def start(cls, folder: Path, budget: float, rates: Rates, work: Workload, *, began: float | None = None,
              log: Callable[[str], None] = print) -> "Pacer":
        """Open the ledger, plan (raising BudgetError when the budget is too small) and print the plan. began:
        time.monotonic() when the demo started (the probe and the target's load count)."""
        ledger = BudgetLedger(folder, budget, began=began)
        choice = ledger.decisions.get("eval")
        plan = plan_demo(budget=budget, spent=ledger.spent, rates=rates, work=work,
                         per_domain=ledger.decisions.get("per_domain_limit"),
                         eval_choice=tuple(choice) if choice else None, finished=frozenset(ledger.stages),
                         refuse=not ledger.resumed)
        ledger.start()
        if ledger.resumed:
            log(f"[demo] resuming: {minutes(ledger.earlier)} of the {minutes(budget)} budget spent by "
                f"{ledger.runs - 1} earlier run{'s' * (ledger.runs > 2)}; {minutes(ledger.left)} left")
        ledger.decide("per_domain_limit", plan.stage("data").settings["per_domain_limit"])
        eval_stage = plan.stage("eval").settings
        ledger.decide("eval", [eval_stage["max_new_tokens"], eval_stage["repeats"]])
        pacer = cls(ledger, plan, rates, work, log)
        # stages an earlier run finished are reused now: the rest gets what is left, as if they ran as predicted
        pacer.earlier = {s.name for s in plan.stages if s.name in ledger.stages}
        if pacer.earlier:
            pacer.done = {name: plan.stage(name).seconds for name in pacer.earlier}
            pacer.plan, _, _ = replan(plan, done=pacer.done, spent=ledger.spent, rates=rates, work=work)
            pacer.planned.update({name: None for name in pacer.earlier})
            pacer.planned.update({s.name: s.seconds for s in pacer.plan.stages})
        if pacer.plan.total > budget + 1:
            log(f"[demo] what is left of the budget cannot hold the least training and evaluation on this machine "
                f"now: the demo ends about {minutes(pacer.plan.total - budget)} past it")
        log("[demo] " + pacer.plan.table().replace("\n", "\n[demo] ")
            + (f"\n[demo]   (finished by an earlier run, reused: {', '.join(sorted(pacer.earlier))})"
               if pacer.earlier else ""))
        return pacer

    @property
    def decisions(self) -> dict:
        """What every run of this budget keeps: per_domain_limit, eval ([new tokens, repeats]), data_built."""
        return self.ledger.decisions

    @property
    def active(self) -> bool:
        return self.plan is not None

    def before(self, name: str) -> dict:
        """What the stage is given by the current plan ({} without a budget or for a stage it does not size)."""
        stage = self.plan.stage(name) if self.plan else None
        return dict(stage.settings) if stage else {}

    def planned_seconds(self, name: str) -> float | None:
        """The seconds the plan gives the stage (None: not planned, or reused from an earlier run)."""
        if name in self.earlier:
            return None
        stage = self.plan.stage(name) if self.plan else None
        return stage.seconds if stage else self.planned.get(name)

    def after(self, name: str, seconds: float, *, reused: bool = False) -> None:
        """Record the stage and plan the rest again; says so when the machine turned out slower than measured.
        reused: the stage found its work done (a rerun): it says nothing of this machine's speed."""
        if not self.plan:
            return
        planned = self.planned_seconds(name)
        self.planned[name] = planned if planned is not None else self.planned.get(name)
        if name in self.earlier:  # finished by an earlier run of this budget: its seconds there stand
            return
        self.ledger.stage(name, planned=planned, real=seconds)
        if self.plan.stage(name) is None:  # an export or other stage the plan counts as one
            return
        if name == "data":  # a rerun answers no more prompts: the data, the cache and the heads stay reusable
            self.ledger.decide("data_built", True)
        first = self.first.stage(name)
        self.done[name] = first.seconds if reused and first is not None else seconds
        self.plan, self.slowdown, note = replan(self.first, done=self.done, spent=self.ledger.spent,
                                                rates=self.rates, work=self.work)
        for stage in self.plan.stages:
            self.planned[stage.name] = stage.seconds
        if note and not reused:  # a rerun's reused stages leave time that the reused heads do not need
            self.notes.append(note)
            self.log(f"[demo] {note}")

    def training_order(self, methods) -> list[str]:
        """The heads the plan gives least first: one that ends early (its epochs, early stopping) leaves its time to
        the next (the EAGLE head, where more training pays most). Without a budget, the recipe's order."""
        if not self.plan:
            return list(methods)
        return sorted(methods, key=lambda m: self.planned.get(f"train {m}") or 0.0)  # None: reused

    def deadline_seconds(self) -> float | None:
        """How long self-distillation may take before no new row starts: 0 once an earlier run built the data (its
        rows are reused and no other starts, whatever a deadline left unanswered then)."""
        stage = self.plan.stage("data") if self.plan else None
        if stage is None:
            return None
        if self.ledger.decisions.get("data_built"):
            return 0.0
        return max(stage.seconds - drain_seconds(self.work, self.rates), EARLIEST_DEADLINE * stage.seconds)

    def finish(self) -> dict:
        """What demo_summary.json records of the budget."""
        if not self.plan:
            return {"budget": None}
        self.ledger.finish()
        return {"budget": self.ledger.budget, "spent": round(self.ledger.spent, 1), "runs": self.ledger.runs,
                "plan": self.first.to_dict(), "rates": vars(self.rates), "workload": _plain(vars(self.work)),
                "slowdown": round(self.slowdown, 3), "notes": self.notes, "decisions": self.ledger.decisions,
                "stages": self.ledger.stages}


def _plain(record: dict) -> dict:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in record.items()}
