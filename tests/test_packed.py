"""serve/packed.py: oneDNN's packed linear for forwards over several tokens, exact where it must be."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from serve import packed
from serve.decoding import plain_generate, speculative_generate
from serve.drafters import build_drafter
from serve.errors import DraftsmithError, TargetError
from serve.packed import (MIN_ROWS, PackedLinear, first_packed_rows, pack_linears, packing_wanted, set_min_rows,
                          tune_packed_rows, unpack_linears)
from serve.target import load_target
from serve.target_config import TargetConfig


def packed_twin(linear: nn.Linear) -> nn.Linear:
    twin = copy.deepcopy(linear)
    pack_linears(twin)
    return twin


def test_packed_linear_matches_f_linear_at_every_row_count():
    torch.manual_seed(0)
    linear = nn.Linear(48, 80)
    twin = packed_twin(linear)
    assert type(twin) is PackedLinear and twin.state_dict().keys() == linear.state_dict().keys()
    with torch.inference_mode():
        for rows in (1, 2, 3, 4, 5, 9, 33):
            x = torch.randn(1, rows, 48)  # (B, T, in) as a decoder layer calls it
            got = twin(x)
            assert got.shape == (1, rows, 80)
            torch.testing.assert_close(got, linear(x), rtol=1e-5, atol=1e-5)
            assert (twin in packed._PACKED) == (rows >= MIN_ROWS)
            packed._PACKED.pop(twin, None)


def test_a_weight_changed_in_place_is_packed_again():
    torch.manual_seed(1)
    linear = packed_twin(nn.Linear(16, 24, bias=False))
    x = torch.randn(6, 16)
    with torch.inference_mode():
        first = linear(x)
    with torch.no_grad():
        linear.weight.mul_(2.0)
    with torch.inference_mode():
        torch.testing.assert_close(linear(x), 2.0 * first, rtol=1e-5, atol=1e-5)


def test_autograd_runs_the_plain_kernel():
    linear = packed_twin(nn.Linear(8, 8))
    x = torch.randn(6, 8, requires_grad=True)
    linear(x).sum().backward()  # oneDNN's packed op has no backward: must not be used here
    assert x.grad is not None and linear not in packed._PACKED


def test_a_layer_onednn_cannot_run_falls_back(monkeypatch):
    linear = nn.Linear(8, 8)
    twin = packed_twin(linear)

    def refuse(*args):
        raise RuntimeError("no oneDNN kernel for this CPU")
    monkeypatch.setattr(torch.ops.mkldnn, "_reorder_linear_weight", refuse, raising=False)
    x = torch.randn(6, 8)
    with torch.inference_mode():
        torch.testing.assert_close(twin(x), linear(x))
    assert type(twin) is nn.Linear


def test_settings():
    model = nn.Sequential(nn.Linear(8, 8))
    assert packing_wanted(model, "on") and packing_wanted(model, "auto") and not packing_wanted(model, "off")
    assert not packing_wanted(model.to(torch.bfloat16), "on")  # float32 only
    with pytest.raises(DraftsmithError, match="auto, on, off"):
        packing_wanted(model, "yes")
    with pytest.raises(TargetError, match="packed_weights"):
        TargetConfig(packed_weights="fast").validate()


def test_auto_leaves_a_model_too_big_for_the_memory(monkeypatch):
    model = nn.Sequential(nn.Linear(8, 8))
    monkeypatch.setattr(packed, "machine_memory_bytes", lambda: 3 * packed.linear_weight_bytes(model))
    assert not packing_wanted(model, "auto") and packing_wanted(model, "on")


def test_unpack_restores_plain_linears():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))
    assert pack_linears(model) == 2
    unpack_linears(model)
    assert [type(m) for m in model] == [nn.Linear, nn.ReLU, nn.Linear]


def test_first_packed_rows_takes_the_packed_kernel_from_where_it_is_faster_up_to_min_rows():
    assert first_packed_rows({2: (1.6, 1.1), 3: (1.9, 1.1)}) == 2  # AMD EPYC: sgemm's 2 and 3 rows are slow
    assert first_packed_rows({2: (1.1, 1.1), 3: (1.9, 1.1)}) == 3  # a tie stays on sgemm
    assert first_packed_rows({2: (1.6, 1.1), 3: (1.2, 1.2)}) == MIN_ROWS  # packed must win at every row count up
    assert first_packed_rows({2: (1.0, 0.97), 3: (1.0, 0.97)}) == MIN_ROWS  # within the margin: not faster
    assert first_packed_rows({}) == MIN_ROWS


def test_tuning_times_both_kernels_and_sets_every_packed_layer(tiny_target_dir, monkeypatch):
    target = load_target(tiny_target_dir, packed_weights="on")
    seen = {}

    def choose(seconds):
        seen.update(seconds)
        return 2
    monkeypatch.setattr(packed, "first_packed_rows", choose)
    assert tune_packed_rows(target.model) == 2
    assert set(seen) == {2, 3} and all(0 < t < 10 for pair in seen.values() for t in pair)
    layers = [m for m in target.model.modules() if type(m) is PackedLinear]
    assert layers and all(m.min_rows == 2 for m in layers)
    packed._PACKED.clear()
    with torch.inference_mode():
        layers[0](torch.randn(2, layers[0].in_features))
    assert layers[0] in packed._PACKED  # 2 rows now run packed
    assert tune_packed_rows(nn.Sequential(nn.Linear(8, 8))) == MIN_ROWS  # nothing packed: nothing timed


@pytest.mark.parametrize("k", [3, 5, 8])
def test_packed_target_decodes_exactly(tiny_target_dir, k):
    """Plain decoding is the same on the packed and the plain target, and speculative decoding on the packed one
    (verify forwards of k + 1 >= 4 tokens through oneDNN) is token-identical to it."""
    plain_target = load_target(tiny_target_dir, packed_weights="off")
    target = load_target(tiny_target_dir, packed_weights="on")
    assert any(type(m) is PackedLinear for m in target.model.modules())
    assert not any(type(m) is PackedLinear for m in plain_target.model.modules())
    for spec, rows in (("oracle", MIN_ROWS), ("ngram", 2)):  # 2: verify forwards of 2 and 3 tokens run packed too
        set_min_rows(target.model, rows)
        drafter = build_drafter(spec, target)
        for text in ("hello hello hello world", "abcabcabcabc", "def f(x):\n    return x"):
            ids = torch.tensor([target.tokenizer.encode(text)])
            ref = plain_generate(plain_target, ids, max_new_tokens=40, eos_token_ids=())
            assert plain_generate(target, ids, max_new_tokens=40, eos_token_ids=()).output_ids == ref.output_ids
            got = speculative_generate(target, drafter, ids, max_new_tokens=40, k=k, eos_token_ids=())
            assert got.output_ids == ref.output_ids, (spec, k, text)
    assert packed._PACKED  # the verify forwards went through the packed weights


def test_a_copied_packed_target_packs_its_own_weights(tiny_target_dir):
    target = load_target(tiny_target_dir, packed_weights="on")
    ids = torch.tensor([target.tokenizer.encode("abcabcabcabc")])
    with torch.inference_mode():
        expected = target.model(ids).logits
        twin = copy.deepcopy(target.model)
        torch.testing.assert_close(twin(ids).logits, expected)
