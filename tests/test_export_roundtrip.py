"""Export -> validate -> read back -> identical drafts and μ, for every method and format the engines support."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.export import export_drafter
from draftsmith.serve.export.common import default_prompts
from draftsmith.serve.core.target import load_target
from tests.export_fixtures import make_native, target  # noqa: F401 (fixture)

COMBOS = [("eagle1", "vllm"), ("eagle1", "sglang"), ("eagle3", "vllm"), ("eagle3", "sglang"),
          ("eagle3", "speculators"), ("medusa", "vllm")]
SERVE_LINE = {"vllm": "vllm serve", "sglang": "python -m sglang.launch_server", "speculators": "vllm serve"}
FLAGS = {("eagle1", "vllm"): ['"method": "eagle"', "LLM(model="],
         ("eagle3", "vllm"): ['"method": "eagle3"', "LLM(model="],
         ("medusa", "vllm"): ['"method": "medusa"', '"num_speculative_tokens": 3'],
         ("eagle1", "sglang"): ["--speculative-algorithm EAGLE --speculative-draft-model-path"],
         ("eagle3", "sglang"): ["--speculative-algorithm EAGLE3 --speculative-draft-model-path"],
         ("eagle3", "speculators"): ['"method": "eagle3"', "LLM(model="]}


@pytest.fixture(scope="module")
def natives(target, tmp_path_factory):
    """EAGLE-3 with a reduced vocabulary; Medusa with the full one (the only one vLLM's Medusa loads)."""
    root = tmp_path_factory.mktemp("natives")
    out = {m: make_native(target, m, root / m) for m in ("eagle1", "eagle3")}
    out["medusa"] = make_native(target, "medusa", root / "medusa", draft_vocab_size=None)
    return out


def _export(natives, target, method, fmt, out, **kw):
    return export_drafter(natives[method], fmt, out, target=target, prompts=default_prompts(target, count=1),
                          k=3, max_new_tokens=12, **kw)


@pytest.mark.parametrize("method,fmt", COMBOS)
def test_round_trip(natives, target, tmp_path, method, fmt):
    report = _export(natives, target, method, fmt, tmp_path / "out", target_spec="tiny")
    assert report.proposals_compared > 0 and report.cycles > 0
    assert report.mu_readback == report.mu_native
    assert (tmp_path / "out" / "model.safetensors").is_file()
    saved = json.loads((tmp_path / "out" / "export_report.json").read_text())
    assert saved["format"] == fmt and saved["method"] == method
    readme = (tmp_path / "out" / "README.md").read_text()
    assert SERVE_LINE[fmt] in readme and str(Path(target.path).resolve()) in readme
    assert f"--format {fmt}" in readme
    assert all(flag in readme for flag in FLAGS[method, fmt]), readme
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["draftsmith_export"]["target_tokenizer_hash"] == target.tokenizer_hash
    if method == "eagle3":
        engine_ids = [1, 2, 3] if fmt in ("vllm", "speculators") else [0, 1, 2]  # ours [2, 0, 1], sorted
        assert report.layer_ids == {"draftsmith": [2, 0, 1], fmt: engine_ids}
    if fmt == "speculators":
        from draftsmith.serve.export.speculators import package_available

        expected = "speculators 0" if package_available() else "not installed"
        assert expected in report.package_check


@pytest.mark.parametrize("method,fmt,message", [
    ("medusa", "sglang", "SGLang's sglang format has no Medusa drafter; use --format vllm"),
    ("eagle1", "speculators", "vLLM's speculators format has no EAGLE-1 drafter; use --format sglang or vllm"),
    ("medusa", "speculators", "vLLM's speculators format has no Medusa drafter; use --format vllm"),
])
def test_unsupported_pairs_are_refused(natives, target, tmp_path, method, fmt, message):
    with pytest.raises(DraftsmithError, match=message):
        _export(natives, target, method, fmt, tmp_path / "out")


def test_unservable_drafters_are_refused(target, tmp_path):
    dup = make_native(target, "eagle3", tmp_path / "dup", aux_layer_ids=[1, 1, 0])
    with pytest.raises(DraftsmithError, match="repeat a layer"):
        export_drafter(dup, "vllm", tmp_path / "o1", target=target)
    last = make_native(target, "eagle3", tmp_path / "last", aux_layer_ids=[3, 1, 0])
    with pytest.raises(DraftsmithError, match="cannot be captured by sglang"):
        export_drafter(last, "sglang", tmp_path / "o2", target=target)
    biased = make_native(target, "eagle1", tmp_path / "bias", fc_bias=True)
    with pytest.raises(DraftsmithError, match="without a bias"):
        export_drafter(biased, "vllm", tmp_path / "o3", target=target)


def test_sglang_eagle1_gets_a_zero_fc_bias(natives, target, tmp_path):
    from safetensors.torch import load_file

    _export(natives, target, "eagle1", "sglang", tmp_path / "sg")
    tensors = load_file(str(tmp_path / "sg" / "model.safetensors"))
    assert float(tensors["fc.bias"].abs().sum()) == 0.0 and tensors["fc.bias"].shape == (32,)


def test_cli_export(natives, tiny_target_factory, tmp_path, capsys):
    from draftsmith.cli import main

    target_dir = tiny_target_factory("llama", num_hidden_layers=4)
    code = main(["export", "--drafter", str(natives["medusa"]), "--format", "vllm", "--out", str(tmp_path / "m"),
                 "--target", str(target_dir), "--prompts", "1", "--max-new-tokens", "8", "--json"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["mu_native"] == report["mu_readback"] and report["method"] == "medusa"
    with pytest.raises(SystemExit):
        main(["export", "--drafter", str(natives["medusa"]), "--format", "vllm", "--out", str(tmp_path / "x"),
              "--target", str(target_dir), "no_such_key=1"])
    with pytest.raises(SystemExit) as refused:
        main(["export", "--drafter", str(natives["medusa"]), "--format", "vllm", "--out", str(tmp_path / "y"),
              "--target", str(target_dir), "--engine-version", "0.33.0"])
    assert refused.value.code == 2 and not (tmp_path / "y").exists()
    assert "vLLM 0.33 removed Medusa" in capsys.readouterr().err


def test_speculators_without_the_package(natives, target, tmp_path, monkeypatch):
    """A clean environment has no `speculators` package: the export is still validated against the schema."""
    import draftsmith.serve.export.speculators as spec

    monkeypatch.setattr(spec, "package_available", lambda: False)
    report = _export(natives, target, "eagle3", "speculators", tmp_path / "s")
    assert "not installed" in report.package_check and report.mu_readback == report.mu_native


# ------------------------------------------------------------------- what the engines' own loaders showed

def _tensor_names(folder):
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        return set(f.keys())


@pytest.mark.parametrize("fmt", ["vllm", "sglang", "speculators"])
def test_full_vocabulary_eagle3_writes_no_vocab_maps(target, tmp_path, fmt):
    """vLLM >= 0.30 has no draft_id_to_target_id parameter for a full draft vocabulary: a d2t fails its load."""
    full = make_native(target, "eagle3", tmp_path / "full", draft_vocab_size=None)
    report = _export({"eagle3": full}, target, "eagle3", fmt, tmp_path / "out")
    assert report.mu_readback == report.mu_native
    names = _tensor_names(tmp_path / "out")
    assert "d2t" not in names and "t2d" not in names and "lm_head.weight" in names


def test_reduced_vocabulary_eagle3_keeps_its_vocab_maps(natives, target, tmp_path):
    _export(natives, target, "eagle3", "vllm", tmp_path / "out")
    assert {"d2t", "t2d"} <= _tensor_names(tmp_path / "out")


def test_reduced_vocabulary_medusa_is_refused_for_vllm_before_writing(target, tmp_path):
    reduced = make_native(target, "medusa", tmp_path / "reduced")  # draft_vocab_size=150 < 259
    with pytest.raises(DraftsmithError, match=r"full-vocabulary drafter .*retrain with model.draft_vocab_size=0"):
        export_drafter(reduced, "vllm", tmp_path / "out", target=target)
    assert not (tmp_path / "out").exists()


def test_engine_version_without_medusa_is_refused_before_writing(natives, target, tmp_path):
    with pytest.raises(DraftsmithError, match=r"does not load in vLLM 0.33.0: vLLM 0.33 removed Medusa.*0.15–0.32"):
        _export(natives, target, "medusa", "vllm", tmp_path / "out", engine_version="0.33.0")
    assert not (tmp_path / "out").exists()
    report = _export(natives, target, "medusa", "vllm", tmp_path / "ok", engine_version="0.32")
    assert report.engine_version == "0.32"
    readme = (tmp_path / "ok" / "README.md").read_text()
    assert "vLLM 0.15–0.32" in readme and "vLLM 0.33 removed Medusa" in readme
    with pytest.raises(DraftsmithError, match="not a release number"):
        _export(natives, target, "eagle3", "vllm", tmp_path / "bad", engine_version="latest")


def test_speculators_readme_leads_with_the_form_that_serves_a_local_target(natives, target, tmp_path):
    _export(natives, target, "eagle3", "speculators", tmp_path / "local")
    readme = (tmp_path / "local" / "README.md").read_text()
    serve_local = f"vllm serve {Path(target.path).resolve()} --speculative-config"
    assert readme.index(serve_local) < readme.index("--verifier ORG/NAME")
    assert "vLLM 0.33 refuses" in readme
    config = json.loads((tmp_path / "local" / "config.json").read_text())
    assert config["norm_before_residual"] is False  # vLLM's reader would default it to true
    # a hub-named verifier: `vllm serve OUT` alone works too, and the README says so
    _export(natives, target, "eagle3", "speculators", tmp_path / "hub", verifier="HuggingFaceTB/tiny-llama")
    readme = (tmp_path / "hub" / "README.md").read_text()
    assert f"vllm serve {(tmp_path / 'hub').resolve()}\n" in readme and "--verifier ORG/NAME" not in readme
    config = json.loads((tmp_path / "hub" / "config.json").read_text())
    assert config["speculators_config"]["verifier"]["name_or_path"] == "HuggingFaceTB/tiny-llama"


@pytest.mark.parametrize("norm", ["fc_norm", "norm_before_fc", "norm_output"])
@pytest.mark.parametrize("fmt", ["vllm", "sglang", "speculators"])
def test_feature_norms_export_under_the_engines_names(target, tmp_path, fmt, norm):
    """EAGLE-3 norms before fc and EAGLE-3.1's normed output: the flag the engine reads, the norms' tensors in the
    engine's (ascending) aux order, and the same drafts read back (norm_output changes every step after the first);
    releases that drop the norm silently are refused by --engine-version."""
    from safetensors.torch import load_file

    from draftsmith.serve.methods.eagle3.export import FEATURE_NORM_FIRST

    native = make_native(target, "eagle3", tmp_path / "native", **{norm: True})
    report = export_drafter(native, fmt, tmp_path / "out", target=target, prompts=default_prompts(target, count=1),
                            k=3, max_new_tokens=12)
    assert report.proposals_compared > 0 and report.mu_readback == report.mu_native
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config[norm] is True
    assert [flag for flag in ("fc_norm", "norm_before_fc", "norm_output") if config.get(flag)] == [norm]
    tensors = load_file(str(tmp_path / "out" / "model.safetensors"))
    if norm == "norm_before_fc":
        assert tensors["input_norm.weight"].shape == (3 * 32,)
        if fmt == "sglang":
            assert config["eagle_config"]["norm_before_fc"] is True
    elif norm == "fc_norm":
        assert [k for k in sorted(tensors) if k.startswith("fc_norm.")] == [f"fc_norm.{i}.weight" for i in range(3)]
    else:  # a flag alone: the same tensors as a plain EAGLE-3 head
        assert not any(k.startswith(("fc_norm.", "input_norm.")) for k in tensors)
        if fmt == "sglang":
            assert "norm_output" not in config["eagle_config"]  # SGLang reads it from the top level only
    first = FEATURE_NORM_FIRST[fmt][norm]
    too_old = ".".join(map(str, first[:-1] + (first[-1] - 1,)))
    with pytest.raises(DraftsmithError, match=f"do not read {norm} and would serve another model silently"):
        export_drafter(native, fmt, tmp_path / "old", target=target, engine_version=too_old)
    assert not (tmp_path / "old").exists()
