"""Tampered exports are rejected with the field named: renamed tensor, missing flag, wrong shape, off-by-one
layer ids, a tied lm_head, random embeddings; and the read-back catches what only drafting reveals."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.export import validate_export, write_export
from draftsmith.serve.export.common import ExportError, compare_drafts, default_prompts
from draftsmith.serve.export.readback import read_export
from draftsmith.serve.drafters.folder import load_drafter
from draftsmith.serve.core.target import load_target
from tests.export_fixtures import make_native, target  # noqa: F401 (fixture)


@pytest.fixture(scope="module")
def exported(target, tmp_path_factory):
    """One export per (method, format) used below (written only: test_export_roundtrip validates them)."""
    root = tmp_path_factory.mktemp("tamper")
    natives = {"eagle3": make_native(target, "eagle3", root / "native-eagle3", seed=3),
               "medusa": make_native(target, "medusa", root / "native-medusa", seed=3, draft_vocab_size=None)}
    out = {}
    for method, fmt in (("eagle3", "vllm"), ("eagle3", "sglang"), ("eagle3", "speculators"), ("medusa", "vllm")):
        folder = root / f"{method}-{fmt}"
        write_export(natives[method], fmt, folder, target=target)
        out[method, fmt] = (folder, natives[method])
    return out


def _copy(src, dst):
    dst.mkdir()
    for f in ("config.json", "model.safetensors"):
        (dst / f).write_bytes((src / f).read_bytes())
    return dst


def _edit_config(folder, change):
    config = json.loads((folder / "config.json").read_text())
    change(config)
    (folder / "config.json").write_text(json.dumps(config))


def _edit_tensors(folder, change):
    tensors = load_file(str(folder / "model.safetensors"))
    change(tensors)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})


def _validate(folder, fmt, native, target):
    return validate_export(folder, fmt, native_dir=native, target=target, prompts=default_prompts(target, count=1),
                           k=3, max_new_tokens=8)


def _tampered(exported, tmp_path, method, fmt):
    src, native = exported[method, fmt]
    return _copy(src, tmp_path / "t"), native


def test_renamed_tensor(exported, target, tmp_path):
    folder, native = _tampered(exported, tmp_path, "eagle3", "sglang")
    _edit_tensors(folder, lambda t: t.__setitem__("layers.0.hidden_norm.weight", t.pop("midlayer.hidden_norm.weight")))
    with pytest.raises(ExportError, match=r"tensor 'midlayer.hidden_norm.weight' is missing \(expected shape \[32\]\)"):
        _validate(folder, "sglang", native, target)


def test_missing_norm_flag(exported, target, tmp_path):
    folder, native = _tampered(exported, tmp_path, "eagle3", "speculators")
    _edit_config(folder, lambda c: c.pop("norm_before_residual"))
    with pytest.raises(ExportError, match="'norm_before_residual' missing, expected false .*defaults it to true"):
        _validate(folder, "speculators", native, target)
    # the engine-faithful reader refuses it too: vLLM's speculators reader would turn it on
    with pytest.raises(ExportError, match="norm_before_residual is true"):
        read_export(folder, target, fmt="speculators")


def test_missing_medusa_bias_flag(exported, target, tmp_path):
    folder, native = _tampered(exported, tmp_path, "medusa", "vllm")
    _edit_config(folder, lambda c: c.pop("medusa_fc_bias"))
    with pytest.raises(ExportError, match="'medusa_fc_bias' missing, expected true"):
        _validate(folder, "vllm", native, target)
    # read as vLLM would (bias-free ResBlocks), the drafts change: the draft comparison alone catches it
    with pytest.raises(ExportError, match="proposes"):
        compare_drafts(target, load_drafter(native, target), read_export(folder, target, fmt="vllm"),
                       default_prompts(target, count=1), k=3, max_new_tokens=8, where="test")


def test_wrong_shape(exported, target, tmp_path):
    folder, native = _tampered(exported, tmp_path, "eagle3", "vllm")
    _edit_tensors(folder, lambda t: t.__setitem__("fc.weight", t["fc.weight"][:, :64].contiguous()))
    with pytest.raises(ExportError, match=r"tensor 'fc.weight' has shape \[32, 64\], expected \[32, 96\]"):
        _validate(folder, "vllm", native, target)


def test_off_by_one_layer_ids(exported, target, tmp_path):
    folder, native = _tampered(exported, tmp_path, "eagle3", "vllm")
    _edit_config(folder, lambda c: c.__setitem__("eagle_aux_hidden_state_layer_ids", [0, 1, 2]))  # SGLang's ids
    with pytest.raises(ExportError, match=r"'eagle_aux_hidden_state_layer_ids' is \[0, 1, 2\], expected \[1, 2, 3\]"):
        _validate(folder, "vllm", native, target)
    # read as vLLM would, id 0 is the embeddings (the input of layer 0), which the drafter never saw
    with pytest.raises(DraftsmithError, match=r"vllm aux layer ids \[0\] do not name an output"):
        read_export(folder, target, fmt="vllm")


def test_tied_lm_head_for_sglang(exported, target, tmp_path):
    folder, native = _tampered(exported, tmp_path, "eagle3", "sglang")
    _edit_config(folder, lambda c: c.__setitem__("tie_word_embeddings", True))
    with pytest.raises(ExportError, match="'tie_word_embeddings' is true, expected false"):
        _validate(folder, "sglang", native, target)


def test_random_embeddings(exported, target, tmp_path):
    folder, native = _tampered(exported, tmp_path, "eagle3", "vllm")
    _edit_tensors(folder, lambda t: t.__setitem__("embed_tokens.weight", torch.randn(259, 32)))
    with pytest.raises(ExportError, match="unexpected tensor 'embed_tokens.weight'"):
        _validate(folder, "vllm", native, target)
    from draftsmith.serve.export.common import check_no_untrained_embeddings

    with pytest.raises(ExportError, match="untrained"):
        check_no_untrained_embeddings({"embed_tokens.weight": torch.randn(259, 32)}, target, where="x")


def test_other_target_refused(exported, tiny_target_factory):
    folder, _ = exported["eagle3", "vllm"]
    other = load_target(tiny_target_factory("llama", num_hidden_layers=4, intermediate_size=48))
    with pytest.raises(Exception, match="trained for target"):
        read_export(folder, other, fmt="vllm")


def test_vocab_maps_with_the_full_vocabulary(target, tmp_path):
    """A d2t beside a full draft vocabulary fails vLLM's load (>= 0.30): the validator and the reader say so."""
    native = make_native(target, "eagle3", tmp_path / "native", draft_vocab_size=None)
    folder = write_export(native, "vllm", tmp_path / "v", target=target)
    _edit_tensors(folder, lambda t: t.update(d2t=torch.zeros(259, dtype=torch.long), t2d=torch.ones(259, dtype=torch.bool)))
    with pytest.raises(ExportError, match="unexpected tensor 'd2t'"):
        _validate(folder, "vllm", native, target)
    with pytest.raises(ExportError, match="no draft_id_to_target_id parameter"):
        read_export(folder, target, fmt="vllm")


def test_reduced_vocabulary_medusa_folder_is_read_as_vllm_would(exported, target, tmp_path):
    """A Medusa folder with (Vd, h) heads, written elsewhere: vLLM's Medusa cannot load it, nor can the reader."""
    folder, _ = _tampered(exported, tmp_path, "medusa", "vllm")
    _edit_config(folder, lambda c: c.__setitem__("truncated_vocab_size", 150))
    _edit_tensors(folder, lambda t: t.update({k: v[:150].contiguous() for k, v in t.items() if k.startswith("lm_heads.")}
                                             | {"token_map": torch.arange(150)}))
    with pytest.raises(ExportError, match="full-vocabulary drafter"):
        read_export(folder, target, fmt="vllm")
