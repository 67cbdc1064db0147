"""scripts/bench/policy_sim.py: policies compared on a modelled clock decide alike whatever the machine does."""
from __future__ import annotations

import sys

import pytest
import torch

from draftsmith.bench import policy_sim
from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.core.target import load_target


def _eagle3_folder(target, tmp_path) -> str:
    from draftsmith.serve.methods.eagle3.head import eagle3_config
    from draftsmith.serve.drafters.folder import build_head, save_drafter

    cfg = eagle3_config(target, aux_layer_ids=[0, 1, 1])
    torch.manual_seed(0)
    return str(save_drafter(build_head(cfg), cfg, tmp_path / "eagle3"))


def test_interpolate_between_and_past_the_measured_points():
    table = {1: 0.1, 4: 0.4, 8: 0.5}
    assert policy_sim.interpolate(table, 1) == 0.1 and policy_sim.interpolate(table, 2) == pytest.approx(0.2)
    assert policy_sim.interpolate(table, 6) == pytest.approx(0.45) and policy_sim.interpolate(table, 16) == 1.0


def test_identical_arms_get_identical_figures(tiny_target_dir, tmp_path, monkeypatch, capsys):
    head = _eagle3_folder(load_target(tiny_target_dir), tmp_path)
    monkeypatch.setattr(sys, "argv", ["policy_sim", "--target", str(tiny_target_dir), "--head", head, "--limit", "1",
                                      "--max-new-tokens", "12", "--arm", "a=hybrid:HEAD", "--arm", "b=hybrid:HEAD",
                                      "--arm", "old=HEAD@trial=1"])
    policy_sim.main()
    lines = capsys.readouterr().out.splitlines()
    overall = next(line for line in lines if line.startswith("overall")).split()
    assert overall[1] == overall[2]  # on wall time two runs of one policy differ; on the modelled clock never
    assert float(overall[3]) > 0


def test_arm_options_are_checked(tiny_target_dir, tmp_path):
    target = load_target(tiny_target_dir)
    head = _eagle3_folder(target, tmp_path)
    assert policy_sim.build_arm("HEAD@trial=2", head, target).policy.trial == 2
    waits = policy_sim.build_arm("hybrid:HEAD@wait=3,max_wait=24", head, target).head.policy
    assert (waits.explore, waits.max_explore, waits._wait) == (3, 24, 3)
    with pytest.raises(DraftsmithError, match="takes trial=N"):
        policy_sim.build_arm("HEAD@explore=3", head, target)
    ngram = policy_sim.build_arm("ngram@max_k=0,reach=always", head, target)
    assert ngram.max_k == 0 and ngram.reach == "always"
    assert policy_sim.build_arm("hybrid:HEAD@max_k=8", head, target).ngram.max_k == 8
    with pytest.raises(DraftsmithError, match="reach=copying"):
        policy_sim.build_arm("ngram@reach=sometimes", head, target)
    hybrid = policy_sim.build_arm("hybrid:HEAD@local=0,trees=0", head, target)
    assert hybrid.ngram.policy.local_weight == 0 and not hybrid.trees and hybrid.head.policy.local_weight == 0
    assert policy_sim.build_arm("ngram@local=8", head, target).policy.local_weight == 8
    assert policy_sim.build_arm("ngram@gen=0", head, target).policy.generation_weight == 0
    assert policy_sim.build_arm("hybrid:HEAD@gen=3", head, target).ngram.policy.generation_weight == 3
    with pytest.raises(DraftsmithError, match="trees=0"):
        policy_sim.build_arm("HEAD@trees=0", head, target)


def test_prompt_lookup_arm_drafts_what_transformers_drafts(tiny_target_dir):
    from draftsmith.eval.peers import Peer, run_peer
    from draftsmith.serve.decoding import speculative_generate

    target = load_target(tiny_target_dir)
    prompt = [5, 6, 7, 8, 5, 6, 9, 10, 7, 8, 5, 6, 7, 8, 11, 5, 6]  # 2-grams that recur with other continuations
    ours = speculative_generate(target, policy_sim.build_arm("prompt_lookup", "", target), torch.tensor([prompt]),
                                max_new_tokens=24, k=3)
    theirs = run_peer(Peer("hf_prompt_lookup", "prompt_lookup"), target, prompt, k=3, max_new_tokens=24,
                      temperature=0.0, top_k=0, top_p=1.0, seed=0)
    assert ours.output_ids == theirs["output_token_ids"]
    assert ours.stats.target_forwards == theirs["target_forwards"] < len(ours.output_ids)  # it drafted, alike


def test_fixed_costs_replace_the_measured_ones(tiny_target_dir):
    from draftsmith.serve.core.costs import verify_costs_for

    target = load_target(tiny_target_dir)
    costs = policy_sim.fixed_costs(target.model, "1.1,1.3,1.3")
    assert verify_costs_for(target.model) is costs  # what every drafter's policy reads
    assert [costs.ratio(n) for n in range(4)] == [1.0, 1.1, 1.3, 1.3]
    assert costs.ratio(5) == pytest.approx(1.3)  # flat past the last given point, as the last two say
    assert costs.step_seconds > 0  # still timed: a head's costs are relative to it
    for bad in ("1.1,x", "0.9,1.2", ""):
        with pytest.raises(DraftsmithError, match="--costs"):
            policy_sim.fixed_costs(target.model, bad)
