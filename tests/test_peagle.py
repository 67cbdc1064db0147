"""P-EAGLE (serve/methods/peagle/): the head's tensors, the decoder drafting in one forward exactly what training
evaluates, the attention of the mask slots, and the recipe's refusals. Training and exact decoding (greedy at
batch 1 and batched, trees, sampling) are in test_train_methods, test_batch_decoder and test_decoder_sampling."""
from __future__ import annotations

import pytest
import torch

from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.core.layers import FINAL
from draftsmith.serve.core.target import load_target
from draftsmith.serve.drafters.folder import build_head, make_drafter
from draftsmith.serve.methods.objective import FeatureBatch, TargetParts
from draftsmith.serve.methods.peagle.head import peagle_config
from draftsmith.serve.methods.peagle.objective import PEagleObjective, parallel_allowed


@pytest.fixture(scope="module")
def target(tiny_target_dir):
    return load_target(tiny_target_dir)


def _states(target, ids):
    with torch.no_grad():
        out = target.model(ids, output_hidden_states=True)
    states = {i: out.hidden_states[i + 1] for i in range(target.num_layers)}
    states[FINAL] = out.hidden_states[-1]
    return states


def test_tensors_are_eagle3s_and_mask_hidden_before_fc(target):
    cfg = peagle_config(target, depths=4, aux_layer_ids=[0, 1, 1], draft_vocab_size=64)
    state = build_head(cfg).state_dict()
    assert state["mask_hidden"].shape == (3 * 32,) and state["fc.weight"].shape == (32, 96)
    assert "midlayer.self_attn.q_proj.weight" in state and state["lm_head.weight"].shape == (64, 32)
    assert cfg.method == "peagle" and cfg.num_speculative_tokens == 4 and cfg.ttt_steps == 1
    assert cfg.mask_token_id == target.tokenizer.eos_token_id  # the tiny target's pad row is all zeros


def test_slots_see_their_anchors_past_and_their_own_earlier_slots():
    allowed = parallel_allowed(torch.tensor([[2, 5]]), 3, 8)  # (1, 8 + 4, 8 + 4)
    assert allowed.shape == (1, 12, 12)
    assert allowed[0, 4, :8].tolist() == [True] * 5 + [False] * 3 and not allowed[0, 4, 8:].any()  # real: causal
    assert allowed[0, 8, :8].tolist() == [True] * 3 + [False] * 5  # anchor 2, depth 1: pairs 0..2
    assert allowed[0, 8, 8:].tolist() == [True, False, False, False]
    assert allowed[0, 9, 8:].tolist() == [True, True, False, False]  # depth 2 sees depth 1 of its block
    assert allowed[0, 11, 8:].tolist() == [False, False, True, True]  # anchor 5: not anchor 2's block


@pytest.mark.parametrize("fc_norm", [False, True])
def test_the_decoder_drafts_in_one_forward_what_training_evaluates(target, fc_norm):
    """Every depth drafted by the decoder from one forward equals the objective's teacher-forced draft for that row
    (the same context, positions and mask slots), for a random head with a reduced vocabulary."""
    torch.manual_seed(3)
    head = build_head(peagle_config(target, depths=4, aux_layer_ids=[0, 1, 1], draft_vocab_size=200,
                                    fc_norm=fc_norm))
    objective = PEagleObjective(head, TargetParts.of(target))
    ids = torch.randint(0, 256, (1, 24), generator=torch.Generator().manual_seed(1))
    states = _states(target, ids)
    drafts = objective.draft_ids(FeatureBatch(ids, torch.ones_like(ids), states, torch.ones_like(ids)), 4)
    drafter = make_drafter(head, target, check=False)
    calls = []
    head.register_forward_hook(lambda *args: calls.append(1))
    for t in (2, 11, 20):  # the pairs 0..t: the last drafts x_{t+2}
        drafter.begin(ids[0, :t + 1], ids[0, 1:t + 2], {k: v[0, :t + 1] for k, v in states.items()})
        calls.clear()
        proposed = drafter.propose(4).leading_chain().tokens.tolist()
        assert proposed == [int(drafts[d][0, t]) for d in range(4)], t
        assert len(calls) == 1  # the pending pairs and the slots in one forward
    # committed in two steps, after a draft whose slots must be forgotten, the context is the same
    drafter.begin(ids[0, :5], ids[0, 1:6], {k: v[0, :5] for k, v in states.items()})
    drafter.propose(4)
    drafter.commit(ids[0, 6:12], {k: v[0, 5:11] for k, v in states.items()})
    assert drafter.propose(4).leading_chain().tokens.tolist() == [int(drafts[d][0, 10]) for d in range(4)]
    assert drafter.propose(2).leading_chain().tokens.tolist() == [int(drafts[d][0, 10]) for d in range(2)]


def test_training_terms_are_one_per_depth_and_anchors_are_counted(target):
    torch.manual_seed(0)
    head = build_head(peagle_config(target, depths=3, aux_layer_ids=[0, 1, 1]))
    objective = PEagleObjective(head, TargetParts.of(target), anchors=4, kind="tv")
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(2))
    batch = FeatureBatch(ids, torch.ones_like(ids), _states(target, ids), torch.ones_like(ids))
    sums = objective(batch.input_ids, batch.loss_mask, batch.hidden_states, batch.attention_mask,
                     noise_seeds=torch.tensor([1, 2]))
    counts = objective.term_counts(batch)
    assert set(sums) == set(counts) == set(objective.term_weights()) == {"depth0", "depth1", "depth2"}
    assert float(counts["depth0"]) == 2 * 14 and float(counts["depth1"]) == float(counts["depth2"]) == 2 * 4
    assert all(0 < float(sums[t].detach()) <= float(counts[t]) for t in sums)  # tv is in [0, 1] per row
    sum(sums.values()).backward()
    assert head.mask_hidden.grad is not None and head.mask_hidden.grad.abs().sum() > 0


@pytest.fixture(scope="module")
def deep_target(tiny_target_factory):
    return load_target(tiny_target_factory("llama", num_hidden_layers=4))  # the engines' aux layers need 4


@pytest.fixture(scope="module")
def exported(deep_target, tmp_path_factory):
    from draftsmith.serve.export import export_drafter
    from tests.export_fixtures import make_native

    root = tmp_path_factory.mktemp("peagle-export")
    native = make_native(deep_target, "peagle", root / "native", seed=3, fc_norm=True)
    report = export_drafter(native, "vllm", root / "vllm", target=deep_target, k=4, max_new_tokens=12)
    return native, root / "vllm", report


def test_vllm_export_reads_back_drafting_as_the_native(exported):
    import json

    from safetensors.torch import load_file

    native, out, report = exported
    assert report.proposals_compared > 0 and report.mu_native == report.mu_readback
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["fc_norm"] is True
    assert config["ptd_token_id"] == json.loads((native / "config.json").read_text())["mask_token_id"]
    state, tensors = load_file(str(native / "model.safetensors")), load_file(str(out / "model.safetensors"))
    # aux ids [2, 0, 1]: the engine concatenates layers 0, 1, 2, so mask_hidden's blocks are permuted like fc's
    blocks = state["mask_hidden"].chunk(3)
    assert tensors["mask_hidden"].shape == (1, 96)
    assert torch.equal(tensors["mask_hidden"][0], torch.cat([blocks[1], blocks[2], blocks[0]]))
    readme = (out / "README.md").read_text()
    assert '"parallel_drafting": true' in readme and '"method": "eagle3"' in readme


def test_a_parallel_folder_is_never_read_as_plain_eagle3(exported, deep_target, tmp_path):
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    from draftsmith.serve.export.common import ExportError
    from draftsmith.serve.export.readback import read_head

    _, out, _ = exported
    assert read_head(out, deep_target, fmt="vllm").config.method == "peagle"
    broken = tmp_path / "broken"
    shutil.copytree(out, broken)
    save_file({k: v for k, v in load_file(str(out / "model.safetensors")).items() if k != "mask_hidden"},
              str(broken / "model.safetensors"))
    with pytest.raises(ExportError, match="'mask_hidden' is missing"):
        read_head(broken, deep_target, fmt="vllm")
    config = json.loads((out / "config.json").read_text())
    del config["ptd_token_id"]
    (broken / "config.json").write_text(json.dumps(config))
    assert read_head(broken, deep_target, fmt="vllm").config.method == "eagle3"  # no token: plain EAGLE-3


@pytest.mark.parametrize("fmt, version, message", [
    ("vllm", "0.34", "does not load in vLLM 0.34: vLLM serves P-EAGLE .* from 0.16 to 0.33"),
    ("vllm", "0.15", "does not load in vLLM 0.15"),
    ("sglang", None, "SGLang serves no P-EAGLE"),
    ("speculators", None, "does not write speculators' `peagle` folders yet")])
def test_an_engine_that_lacks_it_is_one_line_and_nothing_written(exported, deep_target, tmp_path, fmt, version,
                                                                  message):
    from draftsmith.serve.export import export_drafter

    native, _, _ = exported
    with pytest.raises(DraftsmithError, match=message) as err:
        export_drafter(native, fmt, tmp_path / "out", target=deep_target, engine_version=version)
    assert "\n" not in str(err.value) and not (tmp_path / "out").exists()


def test_recipe_refusals_are_one_line(tiny_target_dir):
    from draftsmith.serve.core.config import load_config
    from draftsmith.train.config import TrainConfig

    base = [f"target={tiny_target_dir}", "data.dataset=x", "model.method=peagle"]
    for extra, message in ((["model.num_speculative_tokens=1"], "P-EAGLE drafts 2..16 tokens"),
                           (["model.norm_output=true"], "model.norm_output is an option of EAGLE-3"),
                           (["model.block_size=4"], "model.block_size is an option of DFlash")):
        with pytest.raises(DraftsmithError, match=message):
            load_config(TrainConfig, overrides=base + extra)
