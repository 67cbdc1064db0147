"""The target contract (serve/core/layers.py): layer ids, FINAL, EAGLE-3's default aux layers, the one picker."""
from __future__ import annotations

import pytest
import torch

from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.core.layers import (EAGLE3_MIN_LAYERS, FINAL, check_eagle3_layers, default_eagle3_layers,
                                          pick_hidden_states, published_eagle3_layers)


def test_default_aux_layers_are_distinct_and_servable_at_every_depth():
    for n in range(EAGLE3_MIN_LAYERS, 130):
        ids = default_eagle3_layers(n)
        assert len(set(ids)) == 3 and ids == sorted(ids) and all(0 <= i <= n - 2 for i in ids), (n, ids)
        assert check_eagle3_layers(ids, n) == ids
        if n >= 7:  # where EAGLE-3's published layers do not collide, they are the default
            assert ids == published_eagle3_layers(n)
    assert default_eagle3_layers(30) == [1, 14, 26]
    assert default_eagle3_layers(6) == [1, 2, 3] and default_eagle3_layers(4) == [0, 1, 2]


@pytest.mark.parametrize("n", [1, 2, 3])
def test_too_shallow_for_eagle3_is_a_clear_error(n):
    with pytest.raises(DraftsmithError, match=f"at least 4 layers; this one has {n}: train eagle1 or medusa"):
        default_eagle3_layers(n)


def test_unservable_aux_layers_are_refused():
    with pytest.raises(DraftsmithError, match="exactly 3 aux layers"):
        check_eagle3_layers([1, 2])
    with pytest.raises(DraftsmithError, match="repeats a layer"):
        check_eagle3_layers([1, 2, 2])
    with pytest.raises(DraftsmithError, match=r"\[5\] outside 0..4 for this 6-layer target"):
        check_eagle3_layers([1, 2, 5], 6)  # the last layer's output: no engine captures it
    with pytest.raises(DraftsmithError, match="outside"):
        check_eagle3_layers([FINAL, 1, 2], 6)


def test_training_refuses_what_export_would_refuse():
    from draftsmith.serve.core.config import load_config
    from draftsmith.train.config import TrainConfig, check

    with pytest.raises(DraftsmithError, match="repeats a layer"):
        check(load_config(TrainConfig, overrides=["data.dataset=x", "model.aux_layer_ids=[1,2,2]"]))
    assert check(load_config(TrainConfig, overrides=["data.dataset=x", "model.method=medusa"]))


def test_pick_hidden_states_follows_the_convention(tiny_target_dir):
    from draftsmith.serve.core.target import load_target

    model = load_target(tiny_target_dir).model
    with torch.no_grad():
        out = model(torch.tensor([[5, 6, 7]]), output_hidden_states=True)
    picked = pick_hidden_states(out.hidden_states, (0, 1, FINAL))
    assert torch.equal(picked[0], out.hidden_states[1]) and torch.equal(picked[1], out.hidden_states[2])
    # FINAL is the normed state the lm_head reads
    torch.testing.assert_close(model.lm_head(picked[FINAL]), out.logits)
