"""The demo's budget ledger, `budget.json` in its folder: the budget, the seconds every run has spent (a heartbeat
writes them every few seconds, so a killed run's time counts too), the decisions an interrupted demo keeps (how
much data, the evaluation's size) and each stage's planned and real seconds. A rerun of an interrupted demo keeps
to what is left of its budget; a rerun of a finished one starts a new count with the same decisions.
"""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from draftsmith.serve.core.files import write_text_atomic

LEDGER = "budget.json"
HEARTBEAT_SECONDS = 5.0


class BudgetLedger:
    def __init__(self, folder: Path, budget: float, *, began: float | None = None):
        """began: time.monotonic() when this run started (default now): what it spent before the ledger opened."""
        self.path = Path(folder) / LEDGER
        saved = json.loads(self.path.read_text()) if self.path.is_file() else {}
        same = saved.get("budget") == budget
        finished = saved.get("finished", False)
        self.budget = budget
        self.decisions: dict = saved.get("decisions", {}) if same else {}
        self.earlier = 0.0 if finished or not saved else float(saved.get("spent", 0.0))  # earlier runs, unfinished
        self.runs = 1 if finished or not saved else int(saved.get("runs", 0)) + 1
        self.stages: dict[str, dict] = {} if finished or not same else saved.get("stages", {})
        self._start = time.monotonic() if began is None else began
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._beat = threading.Thread(target=self._heartbeat, name="demo-budget", daemon=True)

    @property
    def resumed(self) -> bool:
        return self.earlier > 0

    @property
    def spent(self) -> float:
        return self.earlier + time.monotonic() - self._start

    @property
    def left(self) -> float:
        return self.budget - self.spent

    def start(self) -> "BudgetLedger":
        self.save()
        self._beat.start()
        return self

    def decide(self, key: str, value):
        """A decision kept across reruns with the same budget: the saved one when there is one, else `value`."""
        with self._lock:
            self.decisions.setdefault(key, value)
        self.save()
        return self.decisions[key]

    def stage(self, name: str, *, planned: float | None, real: float) -> None:
        with self._lock:
            before = self.stages.get(name, {})
            self.stages[name] = {"planned": round(planned, 1) if planned is not None else None,
                                 "real": round(before.get("real", 0.0) + real, 1)}  # an interrupted stage: its runs
        self.save()

    def finish(self) -> None:
        self._stop.set()
        self.save(finished=True)

    def save(self, *, finished: bool = False) -> None:
        with self._lock:
            record = {"budget": self.budget, "spent": round(self.spent, 1), "runs": self.runs, "finished": finished,
                      "decisions": self.decisions, "stages": self.stages}
            write_text_atomic(self.path, json.dumps(record, indent=1))

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_SECONDS):
            self.save()
