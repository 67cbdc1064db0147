"""Aux-layer ids in each engine's convention (pure translation), checked against how each engine captures."""
from __future__ import annotations

import pytest
import torch

from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.methods.eagle3.export import engine_order, fc_in_engine_order
from draftsmith.serve.export.layer_ids import engine_default_layer_ids, from_engine_layer_ids, to_engine_layer_ids
from draftsmith.serve.core.layers import default_eagle3_layers


def test_vllm_and_speculators_ids_are_layer_inputs():
    ours = default_eagle3_layers(30)  # [1, 14, 26]: outputs of layers 1, 14, 26
    for engine in ("vllm", "speculators"):
        assert to_engine_layer_ids(ours, engine, num_layers=30) == [2, 15, 27]
        assert engine_default_layer_ids(engine, num_layers=30) == [2, 15, 27]  # EAGLE-3's published default
    assert engine_default_layer_ids("draftsmith", num_layers=30) == ours


def test_sglang_ids_are_layer_outputs():
    ours = [1, 14, 26]
    ids = to_engine_layer_ids(ours, "sglang", num_layers=30)
    assert ids == ours
    # SGLang's set_eagle3_layers_to_capture stores [val + 1 for val in layer_ids] and captures before that layer:
    captured_inputs = [v + 1 for v in ids]
    assert captured_inputs == to_engine_layer_ids(ours, "vllm", num_layers=30)
    # its default list is already capture indices: [2, n//2, n-3] inputs = our [1, n//2-1, n-4]
    assert [v + 1 for v in engine_default_layer_ids("sglang", num_layers=30)] == [2, 15, 27]


@pytest.mark.parametrize("engine", ["draftsmith", "vllm", "sglang", "speculators"])
def test_round_trip(engine):
    ids = [0, 3, 7, 10]
    assert from_engine_layer_ids(to_engine_layer_ids(ids, engine, num_layers=12), engine, num_layers=12) == ids


def test_unservable_ids_are_refused():
    with pytest.raises(DraftsmithError, match="cannot be captured by vllm"):
        to_engine_layer_ids([1, 5, 11], "vllm", num_layers=12)  # output of the last layer
    with pytest.raises(DraftsmithError, match="cannot be captured by sglang"):
        to_engine_layer_ids([11], "sglang", num_layers=12)
    assert to_engine_layer_ids([11], "draftsmith", num_layers=12) == [11]
    with pytest.raises(DraftsmithError, match="outside 0..11"):
        to_engine_layer_ids([-1], "vllm", num_layers=12)  # FINAL is no aux layer
    with pytest.raises(DraftsmithError, match="do not name an output"):
        from_engine_layer_ids([0], "vllm", num_layers=12)  # vLLM id 0 = the embeddings
    with pytest.raises(DraftsmithError, match="unknown layer-id convention"):
        to_engine_layer_ids([1], "trtllm", num_layers=12)


def test_conventions_match_hf_hidden_states(tiny_target_factory):
    """vLLM id j = input of layer j (captured by a pre-hook, as vLLM's loop does) = HF hidden_states[j]
    = our id j - 1 = output of layer j - 1."""
    from draftsmith.serve.core.target import load_target

    target = load_target(tiny_target_factory("llama", num_hidden_layers=4))
    layers = target.model.model.layers
    captured = {}
    hooks = [layer.register_forward_pre_hook(lambda mod, args, kwargs, j=j: captured.__setitem__(
        j, (kwargs.get("hidden_states") if "hidden_states" in kwargs else args[0]).detach()), with_kwargs=True)
        for j, layer in enumerate(layers)]
    try:
        out = target.model(torch.arange(5, 17)[None], output_hidden_states=True)
    finally:
        for hook in hooks:
            hook.remove()
    ours = [2, 0, 1]
    for i, j in zip(ours, to_engine_layer_ids(ours, "vllm", num_layers=4)):
        assert torch.allclose(captured[j], out.hidden_states[i + 1])  # vLLM capture == our id's tensor
        assert torch.allclose(captured[j], out.hidden_states[j])


def test_fc_blocks_follow_the_engines_ascending_capture_order():
    h = 4
    aux = [2, 0, 1]  # our config order
    assert engine_order(aux) == [1, 2, 0]
    fc = torch.randn(h, 3 * h)
    states = {layer: torch.randn(5, h) for layer in aux}
    ours = torch.cat([states[i] for i in aux], dim=-1) @ fc.T
    engine = torch.cat([states[i] for i in sorted(aux)], dim=-1) @ fc_in_engine_order(fc, aux).T
    assert torch.allclose(ours, engine, atol=1e-6)
