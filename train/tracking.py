"""Experiment tracking on the main process: a local JSONL log (always), wandb (offline without an API key;
`tracking=none` disables it), and a tqdm bar on the console."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

LOG_NAME = "train_log.jsonl"


class Tracker:
    def __init__(self, out_dir: str | Path, *, enabled: bool, use_wandb: bool, config: dict, total_steps: int,
                 start_step: int, progress: bool, project: str, run_name: str):
        self.enabled = enabled
        self.path = Path(out_dir) / LOG_NAME
        self._wandb = None
        self._bar = None
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a")
        if use_wandb:
            import wandb

            if not os.environ.get("WANDB_API_KEY") and not os.environ.get("WANDB_MODE"):
                os.environ["WANDB_MODE"] = "offline"  # no key: keep the run on disk (`wandb sync` later)
            self._wandb = wandb.init(project=project, name=run_name or None, config=config,
                                     dir=str(Path(out_dir)), resume="allow", reinit=True)
        if progress:
            from tqdm import tqdm

            self._bar = tqdm(total=total_steps, initial=start_step, desc="train", dynamic_ncols=True)

    def log(self, record: dict, *, step: int) -> None:
        if not self.enabled:
            return
        record = {"step": step, "time": round(time.time(), 3), **record}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._wandb is not None:
            self._wandb.log({k: v for k, v in record.items() if isinstance(v, (int, float))}, step=step)
        if self._bar is not None and "loss" in record:
            self._bar.set_postfix(loss=f"{record['loss']:.4f}", tok_s=f"{record.get('tokens_per_s', 0):.0f}")

    def retotal(self, total_steps: int) -> None:
        """The run's length changed (optim.max_seconds fitted it): the bar's end moves with it."""
        if self._bar is not None:
            self._bar.total = total_steps
            self._bar.refresh()

    def advance(self, n: int = 1) -> None:
        if self._bar is not None:
            self._bar.update(n)

    def close(self) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.close()
        if self._wandb is not None:
            self._wandb.finish()
        self._file.close()


def read_log(out_dir: str | Path) -> list[dict]:
    path = Path(out_dir) / LOG_NAME
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
