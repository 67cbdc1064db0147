"""`eval --repeats N`: every method timed N times per prompt, interleaved, the fastest run kept."""
from __future__ import annotations

import json

import pytest

from draftsmith.eval import runner, stats
from draftsmith.eval.evaluate import evaluate
from draftsmith.eval.config import EvalConfig
from draftsmith.eval.prompts import EvalPrompt
from draftsmith.eval.report import markdown
from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.core.target import load_target


@pytest.fixture(scope="module")
def target(tiny_target_dir):
    return load_target(tiny_target_dir)


def _run(seconds: float, output=(1, 2, 3)) -> dict:
    return {"output_token_ids": list(output), "target_forwards": 3, "seconds": seconds}


def test_fastest_run_keeps_every_time_and_flags_a_decoder_that_does_not_repeat_itself():
    kept = runner.fastest_run([_run(2.0), _run(1.5), _run(1.8)])
    assert kept["seconds"] == 1.5 and kept["repeat_seconds"] == [2.0, 1.5, 1.8] and not kept["repeats_differ"]
    unstable = runner.fastest_run([_run(2.0), _run(1.5, output=(1, 2, 4))])
    assert unstable["repeats_differ"] and unstable["output_token_ids"] == [1, 2, 4]
    plain = runner.fastest_run([_run(1.0), _run(1.1)])
    # equal outputs, but one side did not repeat itself: not evidence of exactness
    assert stats.exactness([plain], [kept]) == {"identical": 1, "total": 1}
    assert stats.exactness([plain], [runner.fastest_run([_run(2.0), _run(1.5, output=(1, 2, 3)),
                                                         _run(1.9, output=(9,))])]) == {"identical": 0, "total": 1}


def test_timing_spread_is_the_median_relative_spread():
    records = [{"repeat_seconds": [1.0, 1.1]}, {"repeat_seconds": [2.0, 2.0, 2.6]}, {"repeat_seconds": [4.0, 4.2]},
               {"seconds": 1.0}]
    assert stats.timing_spread(records) == pytest.approx(0.1)
    assert stats.timing_spread([{"seconds": 1.0}]) != stats.timing_spread([{"seconds": 1.0}])  # NaN


def test_methods_are_interleaved_and_the_fastest_run_is_kept(target, monkeypatch):
    from draftsmith.eval.drafters import build_entries

    order = []
    real_plain, real_spec = runner._plain, runner._speculative
    monkeypatch.setattr(runner, "_plain", lambda *a: order.append("plain") or real_plain(*a))
    monkeypatch.setattr(runner, "_speculative", lambda t, e, *a: order.append(e.name) or real_spec(t, e, *a))
    times = {"plain": iter([3.0, 2.0]), "ngram": iter([1.0, 4.0])}
    real_timed = runner._timed
    monkeypatch.setattr(runner, "_timed", lambda fn, device: {**real_timed(fn, device),
                                                              "seconds": next(times[order[-1]])})
    entries = build_entries(target, {"ngram": "ngram"}, max_new_tokens=8)
    decoding = runner.Decoding(k=2, temperature=0.0, top_k=0, top_p=1.0, max_new_tokens=8, seed=0)
    records = runner.run_methods(target, entries, [], [EvalPrompt("a", "x", [5, 6, 7, 5, 6])], decoding,
                                 warmup=False, progress=False, repeats=2)
    assert order == ["plain", "ngram", "plain", "ngram"]  # every method once, then again
    assert records["plain"][0]["seconds"] == 2.0 and records["plain"][0]["repeat_seconds"] == [3.0, 2.0]
    assert records["ngram"][0]["seconds"] == 1.0 and records["ngram"][0]["repeat_seconds"] == [1.0, 4.0]
    assert records["ngram"][0]["repeats_differ"] is False
    with pytest.raises(DraftsmithError, match="repeats must be >= 1"):
        runner.run_methods(target, entries, [], [], decoding, progress=False, repeats=0)


def test_evaluate_with_repeats_reports_them(target, tmp_path):
    rows = tmp_path / "p.jsonl"
    rows.write_text(json.dumps({"id": "r1", "domain": "repeat", "prompt": "abc abc abc abc abc"}) + "\n")
    config = EvalConfig(max_new_tokens=8, k=2, progress=False, bootstrap_samples=20, peers=False, cost_model=False,
                        repeats=2)
    result = evaluate(target, {"ngram": "ngram"}, [str(rows)], config)
    s = result["settings"]
    assert s["repeats"] == 2 and "fastest of 2" in s["timing"] and s["timing_spread"] >= 0
    assert all(len(r["repeat_seconds"]) == 2 for r in result["records"])
    assert result["exactness"]["identical"] == result["exactness"]["total"] == 1
    assert "the fastest of 2 runs per method and prompt" in markdown(json.loads(json.dumps(result)), [])


def test_cli_repeats_flag(tiny_target_dir, tmp_path, capsys):
    from draftsmith.cli import main

    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "a", "domain": "d", "prompt": "hello hello hello"}) + "\n")
    out = tmp_path / "out.json"
    assert main(["eval", "--target", str(tiny_target_dir), "--prompts", str(prompts), "--max-new-tokens", "6",
                 "--no-peers", "--no-cost-model", "--quiet", "--repeats", "2", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["settings"]["repeats"] == 2
    assert "timing: the fastest of 2 runs" in capsys.readouterr().out
    with pytest.raises(SystemExit) as err:
        main(["eval", "--target", str(tiny_target_dir), "--repeats", "0"])
    assert err.value.code == 2
    assert "repeats" in capsys.readouterr().err


def test_the_console_states_the_timing_only_when_runs_were_repeated():
    from draftsmith.eval.report import timing_line

    assert timing_line({"repeats": 1, "timing": "one run per method and prompt"}) is None
    assert timing_line({"repeats": 2, "timing": "the fastest of 2 runs per method and prompt"}) is None  # no spread
    line = timing_line({"repeats": 2, "timing": "the fastest of 2 runs per method and prompt", "timing_spread": 0.0123})
    assert line == "timing: the fastest of 2 runs per method and prompt; repeats differed by a median 1.2%"
