"""`evaluate` end to end on a tiny target: the OUT.json schema, μ from records, exactness (and a broken
verifier caught), peers, cost model, sweeps, report and plots, and the CLI."""
from __future__ import annotations

import json

import pytest
import torch

from draftsmith.eval.config import EvalConfig
from draftsmith.eval.report import write_json, write_report
from draftsmith.eval.evaluate import evaluate
from draftsmith.serve.drafters.base import Draft, Drafter
from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.core.target import load_target

PROMPTS = [
    {"id": "r1", "domain": "repeat", "prompt": "abc abc abc abc abc abc abc"},
    {"id": "r2", "domain": "repeat", "prompt": "hello hello hello hello"},
    {"id": "c1", "domain": "code", "prompt": "def f(x):\n    return x + 1\n\ndef g(x):\n    return"},
]
FAST = dict(max_new_tokens=12, k=3, progress=False, bootstrap_samples=50, cost_repeats=1, cost_ks=[1, 2, 3, 4],
            cost_context_tokens=32)
DOMAIN_KEYS = {"prompts", "mu", "acceptance_by_position", "accept_length_histogram", "tokens_per_second",
               "baseline_tokens_per_second", "speedup", "speedup_spread"}
RECORD_KEYS = {"id", "domain", "prompt_token_ids", "output_token_ids", "target_forwards", "accepted_per_cycle",
               "seconds"}


@pytest.fixture(scope="module")
def prompt_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "p.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in PROMPTS) + "\n")
    return path


@pytest.fixture(scope="module")
def target(tiny_target_dir):
    return load_target(tiny_target_dir)


@pytest.fixture(scope="module")
def small_lm(tiny_target_factory):
    """A draft model: another tiny random LM with the target's tokenizer."""
    return tiny_target_factory("llama", seed=1, num_hidden_layers=1)


@pytest.fixture(scope="module")
def result(target, prompt_file, small_lm):
    return evaluate(target, {"ngram": "ngram", "oracle": "oracle", "small": f"model:{small_lm}"},
                    [str(prompt_file)], EvalConfig(**FAST, sweep=["k=1,3", "temperature=0,1.0", "batch_size=1,2"]))


def test_schema(result):
    assert {"target", "settings", "drafters", "domains", "overall", "peers", "cost_model", "exactness",
            "records"} <= set(result)
    assert [d["name"] for d in result["drafters"]] == ["ngram", "oracle", "small"]
    assert result["drafters"][2]["kind"] == "model" and result["drafters"][2]["path"]
    assert all(set(d) >= {"name", "kind", "path"} for d in result["drafters"])
    assert list(result["domains"]) == ["repeat", "code"]
    for per in list(result["domains"].values()) + [result["overall"]]:
        for name in ("ngram", "oracle"):
            assert DOMAIN_KEYS <= set(per[name])
            assert len(per[name]["acceptance_by_position"]) == 3
            assert {"min", "median", "max"} <= set(per[name]["speedup_spread"])
    assert result["domains"]["repeat"]["ngram"]["prompts"] == 2
    # one record per prompt and method: plain, 3 drafters, 3 peers
    assert len(result["records"]) == 3 * 7 and all(RECORD_KEYS <= set(r) for r in result["records"])
    assert result["settings"]["order"] == ["plain", "ngram", "oracle", "small", "hf_plain", "hf_prompt_lookup",
                                           "hf_assisted:small"]


def test_json_is_strict_and_round_trips(result, tmp_path):
    text = write_json(result, tmp_path / "out.json").read_text()
    data = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))
    assert data["overall"]["ngram"]["mu"] == pytest.approx(result["overall"]["ngram"]["mu"])


def test_mu_from_records_equals_reported(result):
    for name in ("ngram", "oracle", "small"):
        for domain in ("repeat", "code", None):
            recs = [r for r in result["records"] if r["drafter"] == name and domain in (None, r["domain"])]
            mu = sum(len(r["output_token_ids"]) for r in recs) / sum(r["target_forwards"] for r in recs)
            block = result["overall"][name] if domain is None else result["domains"][domain][name]
            assert block["mu"] == pytest.approx(mu)
            hist = block["accept_length_histogram"]
            assert sum(hist) == sum(len(r["accepted_per_cycle"]) for r in recs)
            # every cycle yields its accepted drafts plus one token; the prefill yields one (stops may trim)
            assert sum(len(r["output_token_ids"]) for r in recs) <= sum(m * c for m, c in enumerate(hist)) + \
                sum(hist) + len(recs)
    plain = [r for r in result["records"] if r["drafter"] == "plain"]
    assert all(r["target_forwards"] == len(r["output_token_ids"]) for r in plain)
    # the oracle proposes the target's own continuation: every draft is accepted at temperature 0
    assert result["overall"]["oracle"]["mu"] > result["overall"]["ngram"]["mu"] >= 1.0


def test_exactness_reported(result):
    ex = result["exactness"]
    assert ex["checked"] and ex["total"] == 9 and ex["identical"] == 9
    assert ex["by_drafter"] == {name: {"identical": 3, "total": 3} for name in ("ngram", "oracle", "small")}
    assert all(r["matches_plain"] for r in result["records"] if r["drafter"] != "plain")
    for peer in ("hf_plain", "hf_prompt_lookup", "hf_assisted:small"):
        assert result["peers"][peer]["exactness"] == {"identical": 3, "total": 3}


def test_peers_and_cost_model(result):
    pl = result["peers"]["hf_prompt_lookup"]
    assert pl["k"] == 3 and pl["mu"] >= 1.0 and pl["speedup"] > 0 and "speedup_vs_hf_plain" in pl
    assert result["peers"]["hf_plain"]["mu"] == pytest.approx(1.0)
    assisted = result["peers"]["hf_assisted:small"]
    assert assisted["kind"] == "assisted" and assisted["drafter"] == "small" and assisted["mu"] >= 1.0
    cost = result["cost_model"]
    assert set(cost["verify_ratio"]) == {0, 1, 2, 3, 4} and cost["verify_ratio"][0] == 1.0
    ng = cost["drafters"]["ngram"]
    assert ng["c"] >= 0 and set(ng["domains"]) == {"repeat", "code"}
    assert ng["domains"]["code"]["mu"] == result["domains"]["code"]["ngram"]["mu"]
    assert ng["domains"]["code"]["measured_speedup"] == result["domains"]["code"]["ngram"]["speedup"]
    assert ng["overall"]["best_k"]["k"] in (1, 2, 3, 4)
    # the decode phase: every record times it inside its whole run; the oracle's efficiency is reported
    assert all(0 < r["decode_seconds"] < r["seconds"] for r in result["records"] if r["drafter"] == "plain")
    oracle = cost["drafters"]["oracle"]["overall"]
    assert oracle["measured_decode_speedup"] == pytest.approx(result["overall"]["oracle"]["decode_speedup"])
    assert oracle["engine_efficiency"] == pytest.approx(
        oracle["measured_decode_speedup"] / oracle["predicted_decode_speedup"])


def test_cost_model_refits_from_the_saved_json(result, tmp_path):
    from draftsmith.eval.cost_fit import refit

    saved = json.loads(write_json(result, tmp_path / "out.json").read_text())
    again = refit(saved)
    for name in ("ngram", "oracle", "small"):
        want, got = result["cost_model"]["drafters"][name], again["drafters"][name]
        assert got["c"] == pytest.approx(want["c"])
        for domain in ("repeat", "code"):
            for key in ("predicted_speedup", "measured_speedup", "alpha", "cycle_cost"):
                assert got["domains"][domain][key] == pytest.approx(want["domains"][domain][key]), (name, key)
            assert got["domains"][domain]["best_k"]["k"] == want["domains"][domain]["best_k"]["k"]


def test_sweep_points(result):
    points = result["sweeps"]["k"]
    assert [p["value"] for p in points] == [1, 3]
    assert points[1]["overall"]["ngram"]["mu"] == result["overall"]["ngram"]["mu"]  # K=3 is the main run
    assert len(points[0]["overall"]["oracle"]["acceptance_by_position"]) == 1
    assert points[0]["overall"]["oracle"]["mu"] <= 2.0 + 1e-9  # at K=1 at most 2 tokens per forward
    assert points[0]["exactness"]["identical"] == points[0]["exactness"]["total"] == 9
    hot = result["sweeps"]["temperature"][1]
    assert hot["value"] == 1.0 and hot["overall"]["small"]["mu"] >= 1.0
    # every run is seeded: sampled outputs are plain seeded decoding's, token for token (serve/core/noise.py)
    assert hot["exactness"]["against"] == "plain seeded decoding"
    assert hot["exactness"]["identical"] == hot["exactness"]["total"] == 9


def test_batch_size_sweep(result):
    one, two = result["sweeps"]["batch_size"]
    assert one["value"] == 1 and one["overall"]["ngram"]["mu"] == result["overall"]["ngram"]["mu"]  # the main run
    assert two["value"] == 2 and two["exactness"]["identical"] == two["exactness"]["total"] == 9
    assert two["plain"]["baseline"] in ("ours", "hf_generate")
    assert two["plain"]["ours_tokens_per_second"] > 0 and two["plain"]["hf_generate_identical"] == "3/3"
    assert two["overall"]["oracle"]["mu"] > 1.5  # rows keep their own accepted drafts in a batch
    crossover = result["batch_crossover"]
    assert set(crossover) == {"ngram", "oracle", "small"}
    assert set(crossover["oracle"]["predicted_speedup"]) == {1, 2}
    assert crossover["oracle"]["measured_crossover"] in (None, 1, 2)


def test_report_and_plots_written(result, tmp_path):
    paths = write_report(result, tmp_path / "report")
    names = {p.name for p in paths["plots"]}
    assert names == {"mu_per_domain.png", "acceptance_by_position.png", "speedup_vs_k.png",
                     "predicted_vs_measured.png", "mu_vs_temperature.png", "speedup_vs_batch.png"}
    assert all(p.stat().st_size > 5000 and p.read_bytes()[:4] == b"\x89PNG" for p in paths["plots"])
    md = paths["markdown"].read_text()
    assert "## μ and speed per domain" in md and "## Sweep: temperature" in md and "hf_prompt_lookup" in md and "9/9" in md
    assert "## Sweep: batch_size" in md and "Crossover" in md
    per_domain = md[md.index("Speedup over our plain decoding per domain"):]  # prompt lookup beside our n-gram
    assert "| domain | ngram | hf_prompt_lookup |" in per_domain and "| repeat | " in per_domain
    assert {w["drafter"] for w in result["winners"].values()} <= {"ngram", "small"}  # the oracle is a ceiling
    assert "Engine overhead (oracle, decode phase)" in md and "(K+1)/V(K) limit" in md
    assert json.loads(paths["json"].read_text())["exactness"]["identical"] == 9


class JunkDrafter(Drafter):
    """Always proposes token 90: wrong nearly everywhere, so only a lossy verifier would keep it."""
    kind = "junk"

    def propose(self, k, *, temperature=0.0, generator=None, tree=None):
        return Draft(torch.full((k,), 90, dtype=torch.long))


def test_broken_verifier_is_caught(target, prompt_file, monkeypatch):
    import draftsmith.serve.decoding
    from draftsmith.serve.verify import Verdict, verify_greedy

    def accept_everything(tokens, parents, best):  # greedy: the verifier evaluate's exactness check must catch
        verdict = verify_greedy(tokens, parents, best)
        return Verdict(list(range(tokens.numel())), verdict.next_token)

    config = EvalConfig(**{**FAST, "peers": False, "cost_model": False})
    clean = evaluate(target, {"junk": JunkDrafter()}, [str(prompt_file)], config)
    assert clean["exactness"]["identical"] == clean["exactness"]["total"] == 3
    assert clean["exactness"]["audit"]["unexplained"] == clean["exactness"]["audit"]["rounding_flips"] == 0
    monkeypatch.setattr(draftsmith.serve.decoding, "verify_greedy", accept_everything)
    broken = evaluate(target, {"junk": JunkDrafter()}, [str(prompt_file)], config)
    assert broken["exactness"]["total"] == 3 and broken["exactness"]["identical"] < 3
    bad = [r for r in broken["records"] if r["drafter"] == "junk" and not r["matches_plain"]]
    assert bad and all(isinstance(r["first_mismatch"], int) for r in bad)
    # the audit finds every divergence and explains none of them by rounding: junk tokens are far from the argmax
    audit = broken["exactness"]["audit"]
    assert audit["unexplained"] == len(bad) and audit["rounding_flips"] == 0
    assert audit["by_drafter"] == {"junk": {"rounding flip": 0, "unexplained": len(bad)}}
    for d in audit["divergences"]:
        assert d["drafter_token"] == 90 and d["plain_token"] != 90 and d["gap"] > d["rounding"] > 0


def test_cli(tiny_target_dir, prompt_file, tmp_path, capsys):
    from draftsmith.cli import main

    out, report = tmp_path / "out.json", tmp_path / "rep"
    code = main(["eval", "--target", str(tiny_target_dir), "--drafter", "ng=ngram", "--prompts",
                 f"mine={prompt_file}", "--k", "2", "--max-new-tokens", "8", "--limit", "2", "--no-peers",
                 "--no-cost-model", "--quiet", "--json", str(out), "--report", str(report), "bootstrap_samples=20"])
    assert code == 0
    data = json.loads(out.read_text())
    assert data["settings"]["k"] == 2 and data["settings"]["domains"] == {"mine": 2}
    assert data["drafters"][0]["name"] == "ng" and data["peers"] == {} and data["cost_model"] is None
    assert (report / "report.md").is_file() and (report / "config.resolved.yaml").is_file()
    assert "exactness: 2/2" in capsys.readouterr().out
    with pytest.raises(SystemExit) as err:
        main(["eval", "--target", str(tiny_target_dir), "--sweep", "kk=1,2"])
    assert err.value.code == 2
    assert "unknown sweep axis 'kk'" in capsys.readouterr().err


def test_wandb_logging_offline(result, tmp_path, monkeypatch):
    from draftsmith.eval.tracking import log_to_wandb, summary_metrics

    monkeypatch.setenv("WANDB_MODE", "offline")
    metrics = summary_metrics(result)
    assert metrics["ngram/mu"] == pytest.approx(result["overall"]["ngram"]["mu"])
    assert metrics["exactness/identical"] == 9 and "peers/hf_prompt_lookup/speedup" in metrics
    paths = write_report(result, tmp_path / "rep")
    run_id = log_to_wandb(result, paths["plots"], project="draftsmith-test", directory=tmp_path)
    assert list((tmp_path / "wandb").glob(f"offline-run-*-{run_id}"))


def test_drafter_folder_spec(target, tiny_target_dir, prompt_file, tmp_path):
    """A native drafter folder (an untrained EAGLE-3 head) is built through build_drafter and stays lossless."""
    from draftsmith.serve.methods.eagle3.head import eagle3_config
    from draftsmith.serve.drafters.folder import build_head, save_drafter

    torch.manual_seed(0)
    cfg = eagle3_config(target, aux_layer_ids=[0, 1, 1])
    folder = save_drafter(build_head(cfg), cfg, tmp_path / "my-eagle3")
    config = EvalConfig(**{**FAST, "peers": False, "cost_model": False})
    tree_spec = f"{folder}@tree:depth=3,top_k=2,total_tokens=6"
    out = evaluate(target, {"mine": str(folder), "mine-tree": tree_spec}, [str(prompt_file)], config)
    assert out["drafters"] == [
        {"name": "mine", "kind": "eagle3", "path": str(folder.resolve()), "spec": str(folder), "tree": None},
        {"name": "mine-tree", "kind": "eagle3", "path": str(folder.resolve()), "spec": tree_spec,
         "tree": {"depth": 3, "top_k": 2, "total_tokens": 6}}]
    assert out["exactness"]["identical"] == out["exactness"]["total"] == 6
    assert out["overall"]["mine"]["cycles"] > 0 and out["overall"]["mine-tree"]["cycles"] > 0
    trees = [n for rec in out["records"] if rec["drafter"] == "mine-tree" for n in rec["drafted_per_cycle"]]
    assert 1 <= max(trees) <= 3  # drafted_per_cycle of a tree = its depth


def test_tree_spec_errors(target):
    from draftsmith.eval.drafters import build_entries
    from draftsmith.serve.drafters.spec import default_name, split_tree

    assert split_tree("runs/x") == ("runs/x", None)
    assert split_tree("runs/x@tree")[1].total_tokens == 24
    with pytest.raises(DraftsmithError, match="bad tree option"):
        split_tree("runs/x@tree:width=3")
    with pytest.raises(DraftsmithError, match="chains only"):
        build_entries(target, {"ng": "ngram@tree"}, max_new_tokens=8)
    assert default_name("ngram") == "ngram"


def test_each_prompt_is_warmed_up_before_it_is_timed(target, monkeypatch):
    """A prompt's first generation pays for shapes not run yet; the untimed short plain run per prompt takes that
    cost, so the method timed first (plain decoding) is not charged for it."""
    from draftsmith.eval import runner
    from draftsmith.eval.prompts import EvalPrompt

    calls = []
    real = runner._plain
    monkeypatch.setattr(runner, "_plain", lambda t, ids, d, seed: calls.append((ids.shape[1], d.max_new_tokens))
                        or real(t, ids, d, seed))
    prompts = [EvalPrompt("a", "x", [5, 6, 7]), EvalPrompt("b", "x", [8, 9, 10, 11, 12])]
    decoding = runner.Decoding(k=2, temperature=0.0, top_k=0, top_p=1.0, max_new_tokens=24, seed=0)
    records = runner.run_methods(target, [], [], prompts, decoding, progress=False)
    short = runner.WARMUP_TOKENS
    assert calls == [(3, short), (3, short), (3, 24), (5, short), (5, 24)]  # start-up, then per prompt
    assert [len(r["output_token_ids"]) for r in records["plain"]] == [24, 24]
    calls.clear()
    runner.run_methods(target, [], [], prompts, decoding, warmup=False, progress=False)
    assert calls == [(3, 24), (5, 24)]


def test_cli_refuses_a_missing_drafter_folder_or_prompts_file_before_loading_the_target(tiny_target_dir, tmp_path,
                                                                                      capsys, monkeypatch):
    import draftsmith.eval.evaluate as evaluate_module
    from draftsmith.cli import main

    def no_target(*args, **kwargs):
        raise AssertionError("the target loaded before the arguments were checked")

    monkeypatch.setattr(evaluate_module, "_as_target", no_target)
    with pytest.raises(SystemExit) as err:
        main(["eval", "--target", str(tiny_target_dir), "--drafter", f"eagle3={tmp_path}/nonexistent"])
    assert err.value.code == 2
    assert f"no such drafter folder: {tmp_path}/nonexistent" in capsys.readouterr().err
    latin1 = tmp_path / "latin1.jsonl"
    latin1.write_bytes(b'{"prompt": "caf\xe9"}\n')
    with pytest.raises(SystemExit) as err:
        main(["eval", "--target", str(tiny_target_dir), "--prompts", str(latin1)])
    assert err.value.code == 2
    assert "not UTF-8" in capsys.readouterr().err


def test_cli_prints_the_sweep(tiny_target_dir, prompt_file, capsys):
    from draftsmith.cli import main

    code = main(["eval", "--target", str(tiny_target_dir), "--drafter", "ngram", "--prompts", str(prompt_file),
                 "--k", "2", "--max-new-tokens", "6", "--limit", "1", "--no-peers", "--no-cost-model", "--quiet",
                 "--sweep", "k=1,2", "bootstrap_samples=20"])
    out = capsys.readouterr().out
    assert code == 0 and "sweep k:" in out and "k=1: ngram mu" in out and "k=2: ngram mu" in out


def test_the_report_says_which_part_of_a_hybrid_drafted_and_why(target, tiny_target_dir, prompt_file, tmp_path):
    from draftsmith.serve.methods.eagle3.head import eagle3_config
    from draftsmith.serve.drafters.folder import build_head, save_drafter

    torch.manual_seed(0)
    cfg = eagle3_config(target, aux_layer_ids=[0, 1, 1])
    folder = save_drafter(build_head(cfg), cfg, tmp_path / "head")
    config = EvalConfig(**{**FAST, "peers": False, "cost_model": False})
    out = evaluate(target, {"hybrid": f"hybrid:{folder}", "ngram": "ngram"}, [str(prompt_file)], config)
    by = out["drafted_by"]
    assert list(by) == ["hybrid"]  # the drafters that choose a part each cycle
    records = [r for r in out["records"] if r["drafter"] == "hybrid"]
    cycles = sum(r["cycles"] for r in records)  # a last cycle with one token left to make asks for no draft
    assert cycles - len(records) <= sum(by["hybrid"]["overall"].values()) <= cycles
    assert all(reason.split(":")[0] in ("ngram", "head", "tree", "none") for reason in by["hybrid"]["overall"])
    assert set(by["hybrid"]["domains"]) == set(out["domains"])
    assert out["exactness"]["identical"] == out["exactness"]["total"]
    # every cycle both parts proposed in scored all three arms: the tree yields at least either chain
    arms = by["hybrid"]["arms"]["overall"]
    assert arms["cycles"] == sum(r["arms"]["cycles"] for r in records)
    assert arms["cycles"] <= sum(by["hybrid"]["overall"].values())
    assert arms["cycles"] > 0  # the tiny prompts repeat themselves: the n-gram side matches
    assert arms["tokens"]["tree"] >= max(arms["tokens"]["ngram"], arms["tokens"]["head"])
    assert arms["cost"]["tree"] >= arms["cost"]["head"] > 0
    report = write_report(out, tmp_path / "rep")["markdown"].read_text()
    assert "## Which part of hybrid drafted, and why (cycles)" in report
    assert "What each arm of hybrid would have yielded" in report


def test_a_drafter_for_another_target_is_refused_before_the_target_loads(target, tiny_target_factory, tmp_path,
                                                                        capsys, monkeypatch):
    import draftsmith.serve.core.target
    from draftsmith.cli import main
    from draftsmith.serve.methods.eagle3.head import eagle3_config
    from draftsmith.serve.drafters.folder import build_head, save_drafter

    torch.manual_seed(0)
    cfg = eagle3_config(target, aux_layer_ids=[0, 1, 1])
    folder = save_drafter(build_head(cfg), cfg, tmp_path / "for-llama")
    other = tiny_target_factory("llama", hidden_size=48)  # another architecture, the same tokenizer

    def no_load(*args, **kwargs):
        raise AssertionError("the target loaded before the drafter was checked")

    monkeypatch.setattr(draftsmith.serve.core.target, "load_configured", no_load)
    monkeypatch.setattr("draftsmith.eval.evaluate.load_configured", no_load)
    for command in (["eval", "--target", str(other), "--drafter", str(folder)],
                    ["generate", "--target", str(other), "--drafter", f"hybrid:{folder}", "--prompt", "hi"]):
        with pytest.raises(SystemExit) as err:
            main(command)
        assert err.value.code == 2, command
        line = capsys.readouterr().err.strip().splitlines()[-1]
        assert "trained for target" in line and str(other) in line, line


def test_a_batch_sweep_measures_every_size_its_batches_pass_through_before_timing(target, monkeypatch):
    """A batch of 4 whose rows end apart reads the verify costs of 2 and 1 rows too: they are measured before the
    first timed batch, not inside a drafter's timed run (where they cost it 1-2 s of a few seconds)."""
    from draftsmith.eval import batch_runner
    from draftsmith.eval.drafters import build_entries
    from draftsmith.eval.prompts import EvalPrompt

    seen = []
    real = batch_runner._decoder_run

    def run(decoder, prompts, group, d):
        if decoder.costs is not None:
            seen.append(sorted(decoder.costs.measured))
        return real(decoder, prompts, group, d)

    monkeypatch.setattr(batch_runner, "_decoder_run", run)
    prompts = [EvalPrompt(str(i), "x", [5 + i, 6, 7, 8]) for i in range(5)]
    decoding = batch_runner.Decoding(k=2, temperature=0.0, top_k=0, top_p=1.0, max_new_tokens=6, seed=0)
    entries = build_entries(target, {"ngram": "ngram"}, max_new_tokens=6)
    batch_runner.run_batched(target, entries, prompts, decoding, batch_size=3, warmup=False, progress=False)
    assert seen and all(buckets == [1, 2, 4] for buckets in seen)
