"""Bad input on the every-family path gets one line that says what to do (exit 2, nothing written): a target
folder without weights or tokenizer, a family transformers cannot build, a prompts file that is not UTF-8, a
head_dim that does not divide the hidden size; and drafter folders of format 1 (the target family's own layer)
convert exactly where a Llama layer is that layer (Llama, Mistral) and are refused, with what to do, elsewhere."""
from __future__ import annotations

import json
import shutil

import pytest
import torch

from draftsmith.serve.decoding import speculative_generate
from draftsmith.serve.drafters.draft_layer import draft_layer_config
from draftsmith.serve.drafters.folder import load_drafter, read_config
from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.core.target import load_target
from tests.export_fixtures import make_native
from tests.cli_fixtures import cli_error


def test_a_target_folder_without_tokenizer_or_weights(tmp_path, tiny_target_dir, capsys):
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(tiny_target_dir / "config.json", bare / "config.json")
    line = cli_error(capsys, "generate", "--target", bare, "--prompt", "hi")
    assert "has config.json but no tokenizer" in line and "save_pretrained" in line
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_target_dir / name, bare / name)
    line = cli_error(capsys, "generate", "--target", bare, "--prompt", "hi")
    assert "has config.json but no weights" in line
    odd = tmp_path / "odd"
    shutil.copytree(tiny_target_dir, odd)
    (odd / "config.json").write_text(json.dumps({**json.loads((odd / "config.json").read_text()),
                                                 "model_type": "no_such_family"}))
    line = cli_error(capsys, "generate", "--target", odd, "--prompt", "hi")
    assert "cannot build the model" in line and "no_such_family" in line


def test_a_prompts_file_that_is_not_utf8(tmp_path, tiny_target_dir, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_bytes(b'{"prompt": "fine"}\n{"prompt": "caf\xe9"}\n')
    line = cli_error(capsys, "eval", "--target", tiny_target_dir, "--prompts", prompts, "--drafter", "ngram")
    assert f"{prompts}:2: not UTF-8 text (byte 0xe9" in line and "iconv" in line
    from draftsmith.data.prompts import load_prompts

    prompts.write_bytes(b'\xef\xbb\xbf{"prompt": "a BOM is fine"}\n')
    assert [row.messages[-1]["content"] for row in load_prompts(str(prompts))] == ["a BOM is fine"]


def test_the_draft_layer_of_each_quirk():
    base = dict(model_type="x", vocab_size=99, hidden_size=40, num_attention_heads=4, num_key_value_heads=2,
                intermediate_size=64, rms_norm_eps=1e-5, rope_theta=1e4, hidden_act="gelu_pytorch_tanh")
    layer = draft_layer_config(base)
    assert (layer["model_type"], layer["head_dim"], layer["hidden_act"], layer["intermediate_size"]) == \
        ("llama", 10, "silu", 64)
    assert draft_layer_config({**base, "num_experts": 8})["intermediate_size"] == 120  # dense, 3 x hidden
    gemma_rope = {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                  "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}
    assert draft_layer_config({**base, "rope_parameters": gemma_rope})["rope_parameters"]["rope_theta"] == 1e6
    assert draft_layer_config({**base, "head_dim": 256})["head_dim"] == 256  # Gemma-3: heads x head_dim != hidden
    with pytest.raises(DraftsmithError, match="not a multiple of num_attention_heads 3, and no head_dim"):
        draft_layer_config({**base, "num_attention_heads": 3})
    with pytest.raises(DraftsmithError, match="lacks .*hidden_size.*text_config"):
        draft_layer_config({"model_type": "some_vlm", "vocab_size": 99})


def _as_format_1(folder, family: str, **layer_changes) -> None:
    """Rewrite a native folder's config.json as format 1 wrote it: the target family's layer config."""
    path = folder / "config.json"
    data = json.loads(path.read_text())
    data.pop("target_model_type")
    data["draftsmith_drafter"] = 1
    data["model_type"] = family
    data["layer_config"] = {**data["layer_config"], "model_type": family, **layer_changes}
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("method", ["eagle3", "eagle1"])
def test_format_1_llama_and_mistral_heads_convert_exactly(tiny_target_dir, tmp_path, method):
    target = load_target(tiny_target_dir)
    native = make_native(target, method, tmp_path / "v2", **({"aux_layer_ids": [0, 1, 1]} if method == "eagle3"
                                                             else {}))
    ids = torch.randint(0, 256, (1, 10), generator=torch.Generator().manual_seed(0))
    reference = speculative_generate(target, load_drafter(native, target, length="fixed"), ids, max_new_tokens=16,
                                     k=3)
    for family in ("llama", "mistral"):
        old = tmp_path / family
        shutil.copytree(native, old)
        _as_format_1(old, family, sliding_window=4096 if family == "mistral" else None)
        config = read_config(old)
        assert config.model_type == "llama" and config.target_model_type == family and config.draftsmith_drafter == 2
        got = speculative_generate(target, load_drafter(old, target, length="fixed"), ids, max_new_tokens=16, k=3)
        assert got.output_ids == reference.output_ids
        assert got.stats.accepted_per_cycle == reference.stats.accepted_per_cycle


def test_format_1_heads_of_other_families_are_refused_with_what_to_do(tiny_target_dir, tmp_path):
    target = load_target(tiny_target_dir)
    for family, changes in (("qwen3", {}), ("qwen2", {"attention_bias": True}),
                            ("llama", {"hidden_act": "gelu"})):
        old = make_native(target, "eagle3", tmp_path / family, aux_layer_ids=[0, 1, 1])
        _as_format_1(old, family, **changes)
        with pytest.raises(DraftsmithError, match=r"format-1 eagle3 drafter built on .*train it again"):
            read_config(old)
    medusa = make_native(target, "medusa", tmp_path / "medusa")
    _as_format_1(medusa, "qwen3")
    assert read_config(medusa).method == "medusa"  # no decoder layer: loads as it is
