"""K, tree shape and min_confidence default to what a drafter folder records; a flag overrides; generate, eval
and the server say which K they used. The spec grammar is parsed in one place (serve/drafters/spec.py)."""
from __future__ import annotations

import json

import pytest
import torch

from draftsmith.serve.drafters import build_drafter
from draftsmith.serve.drafters.settings import DEFAULT_K, draft_settings, resolve_k
from draftsmith.serve.drafters.spec import DrafterSpecError, parse_drafter_spec
from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.core.target import load_target
from draftsmith.serve.core.target_config import TargetConfig
from draftsmith.serve.tree import TreeSpec


@pytest.fixture(scope="module")
def target(tiny_target_dir):
    return load_target(tiny_target_dir)


def save_folder(target, folder, **recorded):
    """A random EAGLE-3 head folder whose config.json records `recorded` (num_speculative_tokens, tree, ...)."""
    from dataclasses import replace

    from draftsmith.serve.methods.eagle3.head import eagle3_config
    from draftsmith.serve.drafters.folder import build_head, save_drafter

    torch.manual_seed(0)
    cfg = replace(eagle3_config(target, aux_layer_ids=[0, 1, 1]), **recorded)
    return save_drafter(build_head(cfg), cfg, folder)


def test_spec_grammar(tmp_path):
    folder = tmp_path / "d"
    folder.mkdir()
    spec = parse_drafter_spec(f"{folder}:min_confidence=0.3@tree:depth=3")
    assert (spec.kind, spec.path, spec.options, spec.tree, spec.tree_shape) == (
        "folder", str(folder), {"min_confidence": "0.3"}, True, {"depth": 3})
    assert spec.tree_for(TreeSpec(top_k=8)) == TreeSpec(depth=3, top_k=8)  # @tree keys replace the recorded ones
    assert parse_drafter_spec(f"{folder}@chain").tree_for(TreeSpec()) is None
    assert parse_drafter_spec(str(folder)).tree_for(TreeSpec(depth=2)) == TreeSpec(depth=2)
    assert parse_drafter_spec("ngram:max_n=3").options == {"max_n": "3"}
    assert parse_drafter_spec("model:/x/lm").path == "/x/lm"
    with pytest.raises(DrafterSpecError, match="unknown drafter"):
        parse_drafter_spec("nonsense")
    with pytest.raises(DrafterSpecError, match="bad tree option"):
        parse_drafter_spec(f"{folder}@tree:width=2")


def test_folder_records_k_tree_and_min_confidence(target, tmp_path):
    plain = save_folder(target, tmp_path / "plain", num_speculative_tokens=3)
    drafter = build_drafter(str(plain), target)
    assert draft_settings(drafter) == draft_settings(drafter, tree=False)
    assert draft_settings(drafter).k == 3 and draft_settings(drafter, k=2).k == 2
    assert draft_settings(drafter, tree=True).tree == TreeSpec()
    tuned = save_folder(target, tmp_path / "tuned", num_speculative_tokens=4, min_confidence=0.2,
                        tree={"depth": 3, "top_k": 2, "total_tokens": 6})
    drafter = build_drafter(str(tuned), target)
    assert drafter.min_confidence == 0.2
    assert draft_settings(drafter).describe() == {"k": 4, "tree": {"depth": 3, "top_k": 2, "total_tokens": 6}}
    assert draft_settings(drafter, tree=False).tree is None
    assert draft_settings(drafter, shape={"depth": 2}).tree == TreeSpec(depth=2, top_k=2, total_tokens=6)
    assert build_drafter(f"{tuned}:min_confidence=0.5@chain", target).min_confidence == 0.5
    assert build_drafter(f"{tuned}@chain", target).default_tree is None
    assert draft_settings(build_drafter("ngram", target)).k == DEFAULT_K


def test_drafters_that_disagree_on_k_need_a_flag(target, tmp_path):
    a = build_drafter(str(save_folder(target, tmp_path / "a", num_speculative_tokens=3)), target)
    b = build_drafter(str(save_folder(target, tmp_path / "b", num_speculative_tokens=4)), target)
    assert resolve_k([a, build_drafter("ngram", target)]) == 3
    with pytest.raises(DraftsmithError, match="different K.*pass --k"):
        resolve_k([a, b])
    assert resolve_k([a, b], 2) == 2
    with pytest.raises(DraftsmithError, match="k must be >= 1"):
        resolve_k([a], 0)


def test_generate_and_eval_report_the_recorded_k(target, tiny_target_dir, tmp_path, capsys):
    from draftsmith.cli import main

    folder = save_folder(target, tmp_path / "d", num_speculative_tokens=3)
    out = tmp_path / "g.json"
    assert main(["generate", "--target", str(tiny_target_dir), "--drafter", str(folder), "--prompt", "abcabc",
                 "--max-new-tokens", "8", "--quiet", "--json", str(out)]) == 0
    settings = json.loads(out.read_text())["settings"]
    assert settings["k"] == 3 and settings["tree"] is None and "k=3" in capsys.readouterr().err
    assert main(["generate", "--target", str(tiny_target_dir), "--drafter", str(folder), "--prompt", "abcabc",
                 "--max-new-tokens", "8", "--quiet", "--json", str(out), "--k", "2", "--tree"]) == 0
    settings = json.loads(out.read_text())["settings"]
    assert settings["k"] == 2 and settings["tree"] == {"depth": 5, "top_k": 4, "total_tokens": 24}

    from draftsmith.eval.config import EvalConfig
    from draftsmith.eval.evaluate import evaluate

    fast = EvalConfig(max_new_tokens=6, per_domain_limit=1, peers=False, hf_plain=False, cost_model=False, warmup=False,
                      bootstrap_samples=10, progress=False)
    result = evaluate(target, {"mine": str(folder), "ngram": "ngram"}, ["builtin:code"], fast)
    assert result["settings"]["k"] == 3
    result = evaluate(target, {"mine": str(folder)}, ["builtin:code"], EvalConfig(**{**vars(fast), "k": 2}))
    assert result["settings"]["k"] == 2


def test_server_uses_and_reports_the_recorded_k(tiny_target_dir, target, tmp_path):
    from fastapi.testclient import TestClient

    from draftsmith.serve.server import ServeConfig, build_app

    folder = save_folder(target, tmp_path / "d", num_speculative_tokens=3)
    app = build_app(ServeConfig(target=TargetConfig(spec=str(tiny_target_dir)), drafter=str(folder)))
    with TestClient(app) as client:
        assert client.get("/v1/models").json()["data"][0]["num_speculative_tokens"] == 3
        out = client.post("/v1/completions", json={"model": target.name, "prompt": "abcabc", "max_tokens": 6})
        assert out.status_code == 200 and out.json()["usage"]["k"] == 3
