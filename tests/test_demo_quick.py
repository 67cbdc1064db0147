"""`draftsmith demo --quick`: the whole main job at toy scale on the real default target (what CI runs)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
def test_demo_quick_end_to_end(demo_target_dir, tmp_path):
    out = tmp_path / "demo"
    # one torch thread: two threads collapse on a 2-core machine as soon as anything else runs (a parallel test
    # worker): the quick demo's eval took 1044 s with two threads against 278 s with one, same load
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline"}
    command = [sys.executable, "-m", "draftsmith.cli", "demo", "--quick", "--out", str(out), "--budget", "20m"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=1200, cwd=Path(__file__).parents[1],
                          env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "demo_summary.json").read_text())
    # the machine measured, the choices it made, and every stage's planned and real seconds
    hardware = summary["machine"]["hardware"]
    assert hardware["cpu"] and hardware["gflops"]["float32"]["1"] > 0 and summary["threads"] == 1
    assert summary["dtype"] in ("float32", "bfloat16") and summary["machine"]["target"]["step_seconds"] > 0
    assert summary["wall_seconds"] > 0 and summary["budget"]["budget"] == 1200
    planned = summary["budget"]["stages"]
    assert {"data", "train eagle3", "eval", "generate"} <= set(planned) and "capture" not in planned
    # the cache was recorded by the forwards that wrote the answers: no second pass over the data
    data = next(s for s in summary["stages"] if s["name"] == "data")
    assert "tokens' states recorded while generating" in data["note"]
    cache = json.loads((out / "cache" / "manifest.json").read_text())
    assert cache["dataset"]["rows"] == cache["rows"] > 0
    assert all(planned[name]["planned"] > 0 and planned[name]["real"] >= 0 for name in ("data", "eval"))
    assert "[demo] plan for a 20.0 min budget" in proc.stdout and "[demo] machine: " in proc.stdout
    assert {s["name"] for s in summary["stages"]} >= {"target", "data", "train eagle3", "train medusa", "eval",
                                                       "export eagle3/vllm", "export eagle3/sglang", "generate"}
    result = json.loads((out / "report" / "result.json").read_text())
    assert result["exactness"]["identical"] == result["exactness"]["total"] > 0
    assert set(result["overall"]) >= {"eagle3", "medusa", "ngram"}
    for name in ("eagle3-vllm", "eagle3-sglang"):
        assert (out / "exports" / name / "README.md").is_file()
    # the quick demo's Medusa has a reduced vocabulary, which vLLM's Medusa cannot load: refused, not written
    assert not (out / "exports" / "medusa-vllm").exists()
    assert "export medusa/vllm skipped: vLLM's Medusa needs a full-vocabulary drafter" in proc.stdout
    assert "mu per domain" in proc.stdout
    # a second run reuses the dataset, the trained drafters, the evaluation and the exports
    again = subprocess.run(command, capture_output=True, text=True, timeout=1200, cwd=Path(__file__).parents[1],
                           env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    stages = {s["name"]: s for s in json.loads((out / "demo_summary.json").read_text())["stages"]}
    assert "reused" in stages["train eagle3"]["note"] and "reused" in stages["train medusa"]["note"]
    assert "reused" in stages["eval"]["note"] and "reused" in stages["export eagle3/vllm"]["note"]
    assert json.loads((out / "report" / "result.json").read_text()) == result


def test_demo_rejects_a_bad_train_mode(tmp_path):
    from draftsmith.demo.run import DemoConfig, run_demo
    from draftsmith.serve.core.config import ConfigError

    with pytest.raises(ConfigError, match="train_mode must be offline or online"):
        run_demo(DemoConfig(out_dir=str(tmp_path / "d"), train_mode="sideways"))
    assert not (tmp_path / "d").exists()  # refused before anything is written


def test_a_stage_is_reused_only_for_the_same_inputs(tmp_path):
    from draftsmith.demo.run import _spec_digest, finished, record_finished

    drafter = tmp_path / "eagle3" / "drafter"
    drafter.mkdir(parents=True)
    (drafter / "model.safetensors").write_bytes(b"weights v1")
    inputs = {"drafters": {"eagle3": _spec_digest(str(drafter)), "hybrid": _spec_digest(f"hybrid:{drafter}")}}
    assert not finished(tmp_path, "eval", inputs)
    record_finished(tmp_path, "eval", inputs)
    record_finished(tmp_path, "export eagle3-vllm", {"drafter": "x"})
    assert finished(tmp_path, "eval", inputs) and finished(tmp_path, "export eagle3-vllm", {"drafter": "x"})
    (drafter / "model.safetensors").write_bytes(b"weights v2")  # retrained: the evaluation is measured again
    again = {"drafters": {"eagle3": _spec_digest(str(drafter)), "hybrid": _spec_digest(f"hybrid:{drafter}")}}
    assert again != inputs and not finished(tmp_path, "eval", again)
    assert _spec_digest("ngram") == "ngram"


def test_the_demo_table_names_the_fastest_drafter_and_a_tie():
    from draftsmith.eval.winners import winners
    from draftsmith.demo.run import mu_table

    def cell(mu, speedup):
        return {"mu": mu, "speedup": speedup}

    result = {"drafters": [{"name": "eagle3", "kind": "eagle3"}, {"name": "ngram", "kind": "ngram"},
                           {"name": "hybrid", "kind": "hybrid"}],
              "settings": {"repeats": 2, "timing_spread": 0.01},
              "domains": {"code": {"eagle3": cell(1.2, 1.05), "ngram": cell(1.8, 1.50), "hybrid": cell(2.0, 1.60)},
                          "chat": {"eagle3": cell(1.2, 1.08), "ngram": cell(1.1, 1.00), "hybrid": cell(1.3, 1.085)}},
              "overall": {"eagle3": cell(1.2, 1.06), "ngram": cell(1.4, 1.2), "hybrid": cell(1.6, 1.3)}}
    result["winners"] = winners(result)
    rows = {line.split()[0]: line for line in mu_table(result).splitlines()}
    assert rows["domain"].endswith("fastest")
    assert rows["code"].endswith("  hybrid")  # 1.60 against 1.50: outside the 1% resolution
    assert rows["chat"].endswith("  hybrid = eagle3 (tie)")  # 1.085 against 1.08: within it
    assert rows["overall"].endswith("  hybrid")
    assert "1.60x" in rows["code"] and "2.00" in rows["code"]
