"""serve/core/packed.py: oneDNN's packed linear for forwards over several tokens, exact where it must be."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from draftsmith.serve.core import packed
from draftsmith.serve.decoding import plain_generate, speculative_generate
from draftsmith.serve.drafters import build_drafter
from draftsmith.serve.core.errors import DraftsmithError, TargetError
from draftsmith.serve.core.packed import (MIN_ROWS, PackedLinear, choose_kernels, pack_linears, packing_wanted,
                                          packs_bf16, remember_setting, set_small_kernels, tune_small_rows,
                                          unpack_linears)
from draftsmith.serve.core.target import load_target
from draftsmith.serve.core.target_config import TargetConfig


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
        for kernels in (("sgemm",) * 3, ("packed",) * 3, ("padded",) * 3, ("sgemm", "padded", "packed")):
            twin.small = kernels
            for rows in (1, 2, 3, 4, 5, 9, 33):
                x = torch.randn(1, rows, 48)  # (B, T, in) as a decoder layer calls it
                got = twin(x)
                assert got.shape == (1, rows, 80)
                torch.testing.assert_close(got, linear(x), rtol=1e-5, atol=1e-5)
                assert (twin in packed._PACKED) == (rows >= MIN_ROWS or kernels[rows - 1] != "sgemm"), (kernels, rows)
                packed._PACKED.pop(twin, None)
        assert twin(torch.randn(0, 48)).shape == (0, 80)


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


def test_choose_kernels_takes_the_fastest_per_row_count_when_it_beats_sgemm():
    epyc_vm = {1: {"sgemm": 1.0, "packed": 1.02, "padded": 0.92}, 2: {"sgemm": 1.0, "packed": 0.75, "padded": 0.7},
               3: {"sgemm": 1.0, "packed": 0.66, "padded": 0.7}}
    assert choose_kernels(epyc_vm) == ("padded", "padded", "packed")
    tie = {1: {"sgemm": 1.0, "packed": 0.97, "padded": 0.99}}  # within the margin: sgemm stays
    assert choose_kernels(tie) == ("sgemm",) * 3
    assert choose_kernels({}) == ("sgemm",) * 3


def test_tuning_times_every_kernel_and_sets_every_packed_layer(tiny_target_dir, monkeypatch):
    target = load_target(tiny_target_dir, packed_weights="on")
    seen = {}

    def choose(ratios):
        seen.update(ratios)
        return ("padded", "packed", "sgemm")
    monkeypatch.setattr(packed, "choose_kernels", choose)
    assert tune_small_rows(target.model) == ("padded", "packed", "sgemm")
    assert set(seen) == {1, 2, 3} and all(set(r) == set(packed.KERNELS) for r in seen.values())
    assert all(r["sgemm"] == 1.0 and 0 < min(r.values()) for r in seen.values())
    layers = [m for m in target.model.modules() if type(m) is PackedLinear]
    assert layers and all(m.small == ("padded", "packed", "sgemm") for m in layers)
    packed._PACKED.clear()
    with torch.inference_mode():
        layers[0](torch.randn(1, layers[0].in_features))
    assert layers[0] in packed._PACKED  # a 1-row forward now runs packed (padded)
    assert tune_small_rows(nn.Sequential(nn.Linear(8, 8))) == ("sgemm",) * 3  # nothing packed: nothing timed
    with pytest.raises(ValueError, match="small-row kernels"):
        set_small_kernels(target.model, ("fast",) * 3)


@pytest.mark.parametrize("k", [3, 5, 8])
def test_packed_target_decodes_exactly(tiny_target_dir, k):
    """Plain decoding is the same on the packed and the plain target, and speculative decoding on the packed one
    (verify forwards of k + 1 >= 4 tokens through oneDNN) is token-identical to it."""
    plain_target = load_target(tiny_target_dir, packed_weights="off")
    target = load_target(tiny_target_dir, packed_weights="on")
    assert any(type(m) is PackedLinear for m in target.model.modules())
    assert not any(type(m) is PackedLinear for m in plain_target.model.modules())
    for spec, kernels in (("oracle", ("sgemm",) * 3), ("ngram", ("sgemm", "packed", "packed")),
                          ("ngram", ("padded",) * 3)):  # plain steps and 2- and 3-token verifies off sgemm too
        set_small_kernels(target.model, kernels)
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


def test_bf16_packs_where_the_setting_allows(monkeypatch):
    """bfloat16 linears pack for invariant decoding and `suspended` forwards under the target's packed_weights
    setting: auto where the copy fits a quarter of the memory, on always, off never; float32 is packing_wanted's."""
    model = nn.Sequential(nn.Linear(8, 8)).to(torch.bfloat16)
    assert packs_bf16(model)
    remember_setting(model, "off")
    assert not packs_bf16(model)
    monkeypatch.setattr(packed, "machine_memory_bytes", lambda: 3 * packed.linear_weight_bytes(model))
    remember_setting(model, "on")
    assert packs_bf16(model)
    remember_setting(model, "auto")
    assert not packs_bf16(model)
    assert not packs_bf16(nn.Sequential(nn.Linear(8, 8)))
    remember_setting(model, "on")
    assert packs_bf16(model)
    assert not packs_bf16(model.float())  # decided again for the model's new dtype, not read from the last answer
    with pytest.raises(DraftsmithError, match="auto, on, off"):
        remember_setting(model, "yes")


def test_bf16_packed_linear_matches_f_linear():
    torch.manual_seed(0)
    linear = nn.Linear(64, 96).to(torch.bfloat16)
    twin = packed_twin(linear)
    with torch.inference_mode():
        for rows in (4, 8, 9, 64):
            x = torch.randn(1, rows, 64, dtype=torch.bfloat16)
            torch.testing.assert_close(twin(x), linear(x))  # bf16's tolerance (bit-equal on an AVX512-BF16 EPYC)
    assert twin in packed._PACKED


def test_suspended_packs_a_bf16_target_and_gives_its_linears_back(tiny_target_dir):
    """A bf16 target decodes on packed invariant tiles; inside `suspended` its linears are PackedLinear, and after it
    invariant again, the packed copies kept for the next block. packed_weights=off packs nothing."""
    from draftsmith.serve.core.invariant import InvariantLinear, suspended

    for setting, packs in (("auto", True), ("off", False)):
        model = load_target(tiny_target_dir, dtype="bfloat16", packed_weights=setting).model
        linears = [m for m in model.modules() if type(m) is InvariantLinear]
        assert linears and all(m.packed == packs for m in linears)
        with suspended(model), torch.inference_mode():
            assert all(type(m) is (PackedLinear if packs else nn.Linear) for m in linears)
            model(input_ids=torch.tensor([[1, 2, 3, 4, 5]]))
        assert all(type(m) is InvariantLinear and m.packed == packs for m in linears)
        assert (linears[0] in packed._PACKED) == packs
