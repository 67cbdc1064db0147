"""A drafting method is one folder and one registration (serve/methods/registry.py): a method from outside the
project's packages (tests/toy_method/) trains, drafts exactly and is refused by the exporters with no edit to any other
file; a method name that is not registered, a name registered twice and a drafter folder of a method that is not
installed are one line each naming the registered methods, exit 2 at the command line."""
from __future__ import annotations

import importlib
import json

import pytest
import torch

from draftsmith.serve.core.config import load_config
from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.methods import Method, MethodError, names, register
from draftsmith.serve.methods.registry import unregister
from draftsmith.train.config import TrainConfig
from tests.cli_fixtures import cli_error


@pytest.fixture
def toy():
    """The toy method registered for one test (its module stays imported; its registration does not)."""
    module = importlib.import_module("tests.toy_method")
    register(module.METHOD)
    yield module.METHOD
    unregister("toy")


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    from tests.train_fixtures import greedy_rows, save_rows, sharp_target

    root = tmp_path_factory.mktemp("toy")
    target = sharp_target(root / "target", num_hidden_layers=2)
    return target, save_rows(greedy_rows(target, rows=48, new_tokens=32), root / "data"), root


def _train(target, dataset, out, method: str):
    from draftsmith.train.run import train_drafter

    return train_drafter(load_config(TrainConfig, overrides=[
        f"target={target}", f"data.dataset={dataset}", f"out_dir={out}", f"model.method={method}",
        "optim.batch_size=8", "optim.max_steps=60", "optim.lr=1e-2", "data.eval_rows=6", "tracking=none",
        "log.progress=false", "log.every=20", "checkpoint.every=0"]))


def test_a_method_from_outside_trains_drafts_exactly_and_is_refused_by_the_exporters(toy, job, tmp_path, capsys):
    from draftsmith.serve.core.target import load_target
    from draftsmith.serve.decoding import plain_generate, speculative_generate
    from draftsmith.serve.drafters import build_drafter
    from draftsmith.serve.export import export_drafter
    from draftsmith.train.tracking import read_log

    assert "toy" in names()
    target_dir, dataset, root = job
    folder = _train(target_dir, dataset, tmp_path / "run", "toy")
    assert json.loads((folder / "config.json").read_text())["method"] == "toy"
    evals = [r for r in read_log(tmp_path / "run") if r.get("event") == "eval"]
    assert evals[-1]["agreement"][0] > evals[0]["agreement"][0] + 0.15, evals  # it learned the target

    target = load_target(target_dir)
    drafter = build_drafter(str(folder), target)
    assert drafter.kind == "toy"
    gen = torch.Generator().manual_seed(3)
    accepted = 0.0
    for _ in range(3):
        prompt = torch.randint(0, 256, (1, 6), generator=gen)
        plain = plain_generate(target, prompt, max_new_tokens=24).output_ids
        out = speculative_generate(target, drafter, prompt, max_new_tokens=24, k=1)
        assert out.output_ids == plain  # exact against plain greedy decoding
        accepted += out.stats.mu
    assert accepted / 3 > 1.05  # and its drafts are accepted

    for fmt in ("vllm", "sglang", "speculators"):
        with pytest.raises(DraftsmithError) as refused:
            export_drafter(folder, fmt, tmp_path / fmt, target=target)
        assert "\n" not in str(refused.value) and "toy" in str(refused.value), str(refused.value)
        assert not (tmp_path / fmt).exists()  # refused before anything is written
    line = cli_error(capsys, "export", "--drafter", folder, "--format", "vllm", "--out", tmp_path / "cli")
    assert line.startswith("error: --format vllm cannot export method 'toy'"), line


def test_an_unregistered_method_is_one_line_naming_the_registered(job, tmp_path, capsys):
    target, dataset, _ = job
    for name in ("eagle9", "ngram"):  # a name nobody registered; a drafter that trains nothing
        with pytest.raises(MethodError, match=rf"model.method '{name}' is not a registered trained method; "
                                              rf"registered: dflash, eagle1, eagle3, gemma4_assistant, medusa, mtp, "
                                              rf"peagle \("):
            load_config(TrainConfig, overrides=[f"target={target}", f"data.dataset={dataset}", f"model.method={name}"])
        line = cli_error(capsys, "train", f"target={target}", f"data.dataset={dataset}", f"out_dir={tmp_path / 'o'}",
                         f"model.method={name}")
        assert line.startswith(f"error: model.method '{name}' is not a registered trained method; registered: "
                               f"dflash, eagle1, eagle3, gemma4_assistant, medusa, mtp, peagle ("), line
        assert not (tmp_path / "o").exists()
    from draftsmith.serve.drafters import parse_drafter_spec

    with pytest.raises(DraftsmithError, match=r"unknown drafter 'eagle9': use gemma4_assistant:DIR, hybrid:DIR, "
                                              r"model:PATH, mtp, mtp:k=2, ngram, ngram:max_n=3, oracle, or a "
                                              r"trained drafter folder"):
        parse_drafter_spec("eagle9")


def test_two_methods_of_one_name_are_refused(toy):
    twin = Method(name="eagle3", title="Another EAGLE-3", config=toy.config, head=toy.head, drafter=toy.drafter,
                  objective=toy.objective, layers=toy.layers)
    with pytest.raises(MethodError, match=r"two drafting methods register the name 'eagle3' \(EAGLE-3 and Another "
                                          r"EAGLE-3\); registered: dflash, eagle1, eagle3, gemma4_assistant, hybrid, "
                                          r"medusa, model, mtp, ngram, oracle, peagle, toy"):
        register(twin)
    from draftsmith.serve.methods import method

    assert method("eagle3").title == "EAGLE-3"  # the first registration stands


def test_a_drafter_folder_of_a_method_not_installed_is_refused(toy, job, tmp_path, capsys):
    target_dir, dataset, _ = job
    folder = _train(target_dir, dataset, tmp_path / "run", "toy")
    unregister("toy")  # a user without the package that brought the method
    from draftsmith.serve.core.target import load_target
    from draftsmith.serve.drafters import build_drafter

    with pytest.raises(DraftsmithError, match="drafter method .toy. is not a registered trained method; registered: "
                                              "dflash, eagle1, eagle3, gemma4_assistant, medusa, mtp, peagle"):
        build_drafter(str(folder), load_target(target_dir))
    line = cli_error(capsys, "export", "--drafter", folder, "--format", "vllm", "--out", tmp_path / "x")
    assert ("drafter method 'toy' is not a registered trained method; registered: dflash, eagle1, eagle3, "
            "gemma4_assistant, medusa, mtp, peagle") in line, line


def test_a_method_of_another_package_registers_through_its_entry_point(monkeypatch):
    """A package that declares `[project.entry-points."draftsmith.methods"]` registers on the registry's first read;
    one whose module fails to import is one line naming it."""
    import sys
    from importlib.metadata import EntryPoint

    from draftsmith.serve.methods import registry

    monkeypatch.setattr(registry, "_loaded", False)
    monkeypatch.delitem(sys.modules, "tests.toy_method", raising=False)  # imported afresh by the entry point
    toy = EntryPoint(name="toy", value="tests.toy_method", group=registry.ENTRY_POINTS)
    monkeypatch.setattr(registry, "entry_points", lambda group: [toy] if group == registry.ENTRY_POINTS else [])
    try:
        assert "toy" in registry.names() and registry.method("toy").title == "Toy"
    finally:
        unregister("toy")
    broken = EntryPoint(name="broken", value="tests.no_such_module", group=registry.ENTRY_POINTS)
    monkeypatch.setattr(registry, "_loaded", False)
    monkeypatch.setattr(registry, "entry_points", lambda group: [broken])
    with pytest.raises(MethodError, match=r"the drafting method 'broken' of an installed package "
                                          r"\(tests.no_such_module, .*fails to import: ModuleNotFoundError"):
        registry.names()
