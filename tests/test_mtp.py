"""MTP: a target's own multi-token-prediction layer as a drafter. A tiny target of each family with an MTP form ships
a layer in its checkpoint under the family's names; `--drafter mtp` reads it back (equal to what was written) and
decodes with output identical to plain greedy decoding at batch 1 and 4, and samples exactly in distribution; MiMo-V2's
sliding-window layer drafts as transformers' sliding layer does past its window;
`train model.method=mtp` starts from the shipped layer (a fresh layer of the target's own family where it ships none);
a target without one, or a layer that does not fit, is refused in one line."""
from __future__ import annotations

import json

import pytest
import torch

from draftsmith.serve.batch.decoder import BatchDecoder, Job
from draftsmith.serve.core.target import Target, load_target
from draftsmith.serve.decoding import plain_generate, speculative_generate
from draftsmith.serve.drafters import DrafterSpecError, build_drafter
from tests.decoder_fixtures import VOCAB, sampled_first_tokens
from tests.mtp_fixtures import MTP_COUNT, save_mtp_target
from tests.tiny_models import save_tiny_target, tiny_model, tiny_tokenizer

FAMILIES = sorted(MTP_COUNT)
QWEN_FORM = [f for f in FAMILIES if MTP_COUNT[f] == "mtp_num_hidden_layers"]


@pytest.fixture(scope="module")
def mtp_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("mtp")
    return {family: save_mtp_target(root / family, family) for family in FAMILIES}


def _prompts(count: int, seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (n,), generator=gen).repeat(2).tolist() for n in (5, 7, 4, 6, 8)[:count]]


@pytest.mark.parametrize("family", QWEN_FORM)
def test_the_shipped_layer_reads_back_as_written_under_the_familys_names(mtp_dirs, family):
    from safetensors import safe_open

    from draftsmith.serve.methods.mtp.from_target import shipped_head
    from draftsmith.serve.methods.mtp.shipped import checkpoint_files

    folder = mtp_dirs[family]
    target = load_target(folder)
    with safe_open(str(checkpoint_files(folder)[0]), "pt") as handle:
        keys = set(handle.keys())
        full = next(i for i, kind in enumerate(target.config.get_text_config().layer_types) if kind == "full_attention")
        own = {k.split(f"layers.{full}.", 1)[1] for k in keys if f"layers.{full}." in k and not k.startswith("mtp.")}
        shipped = {k[len("mtp.layers.0."):] for k in keys if k.startswith("mtp.layers.0.")}
        assert shipped == own  # the target's own full-attention layer's names (experts one tensor each)
        assert {"mtp.fc.weight", "mtp.norm.weight", "mtp.pre_fc_norm_embedding.weight",
                "mtp.pre_fc_norm_hidden.weight"} <= keys
        written = {k: handle.get_tensor(k) for k in keys if k.startswith("mtp.")}
    head = shipped_head(target)
    state = head.state_dict()
    assert torch.equal(state["layers.0.eh_proj.weight"], written["mtp.fc.weight"])
    assert torch.equal(state["layers.0.post_norm.weight"], written["mtp.norm.weight"])
    # and back: the head's tensors written under the checkpoint's names are the checkpoint's
    from draftsmith.serve.methods.mtp.head import layer_config
    from draftsmith.serve.methods.mtp.shipped import QWEN, head_state_to_checkpoint

    again = head_state_to_checkpoint(state, QWEN, layer_config(head.config.layer_config))
    assert set(again) == {k[len("mtp."):] for k in written}
    assert all(torch.equal(again[k[len("mtp."):]], v) for k, v in written.items())


@pytest.mark.parametrize("family", FAMILIES)
def test_the_shipped_layer_drafts_exactly_at_batch_1_and_4(mtp_dirs, family):
    target = load_target(mtp_dirs[family])
    drafter = build_drafter("mtp:length=fixed", target)
    prompts = _prompts(5)
    plain = [plain_generate(target, torch.tensor([p]), max_new_tokens=20).output_ids for p in prompts]
    hybrid = build_drafter("hybrid:mtp:length=fixed", target)  # the n-gram drafter beside it
    drafted = 0
    for prompt, expected in zip(prompts[:2], plain):
        for one in (drafter, hybrid):
            spec = speculative_generate(target, one, torch.tensor([prompt]), max_new_tokens=20, k=3)
            assert spec.output_ids == expected
            drafted += sum(spec.stats.drafted_per_cycle)
    assert drafted > 0
    decoder = BatchDecoder(target, build_drafter("mtp:length=fixed,k=2", target), slots=4, k=2)
    for i, prompt in enumerate(prompts):
        decoder.add(Job(i, prompt, max_new_tokens=20))
    done = decoder.run()
    assert [f.result.output_ids for f in done] == plain
    assert sum(sum(f.result.stats.drafted_per_cycle) for f in done) > 0


def test_sampling_with_an_mtp_layer_matches_the_targets_distribution():
    """A vocab-8 Qwen3-Next target and a random MTP layer of its family (q a real distribution, differing from p):
    the first three tokens' joint equals the target's enumerated one (chi-square)."""
    from draftsmith.serve.drafters.folder import make_drafter
    from draftsmith.serve.methods.mtp.head import MtpHead, mtp_config

    model = tiny_model("qwen3_next", vocab_size=VOCAB, seed=3, eos_token_id=None, pad_token_id=None)
    target = Target(model=model, tokenizer=tiny_tokenizer(), name="tiny-qwen3_next-v8", path="")
    torch.manual_seed(4)
    drafter = make_drafter(MtpHead(mtp_config(target, norm_output=True)).eval(), target, check=False,
                           length="fixed")
    p, accepted = sampled_first_tokens(target, drafter)
    assert accepted > 60 and p > 1e-3


@pytest.mark.parametrize("family", ["qwen3_next", "nemotron_h", "mimo_v2_flash"])
def test_training_starts_from_the_shipped_layer(mtp_dirs, tmp_path, family):
    from draftsmith.serve.core.config import load_config
    from draftsmith.serve.methods.mtp.from_target import shipped_head
    from draftsmith.train.config import TrainConfig
    from draftsmith.train.heads import head_config
    from draftsmith.train.run import init_head

    target = load_target(mtp_dirs[family], dtype="float32")
    config = load_config(TrainConfig, overrides=[f"target={mtp_dirs[family]}", "model.method=mtp",
                                                 "model.num_speculative_tokens=2", f"out_dir={tmp_path}"])
    cfg = head_config(config, target)
    assert cfg.norm_output and cfg.ttt_steps == 2  # the next step reads the normed output (MiMo's config names no
    # count: its checkpoint's tensors say it ships the layer)
    head, _ = init_head(cfg, target, [], [], vocab_rows=0, seed=0)
    shipped = shipped_head(target).state_dict()
    assert all(torch.equal(v, shipped[k]) for k, v in head.state_dict().items())


def test_a_target_without_mtp_layers_is_refused_in_one_line(tmp_path):
    target = load_target(save_tiny_target(tmp_path / "llama", "llama"))
    with pytest.raises(DrafterSpecError) as refused:
        build_drafter("mtp", target)
    assert "ships no MTP layer" in str(refused.value) and "model.method=mtp" in str(refused.value)
    assert "\n" not in str(refused.value)


def test_a_config_naming_mtp_layers_the_checkpoint_lacks_is_refused(tmp_path):
    folder = save_tiny_target(tmp_path / "bare", "qwen3_5", mtp_num_hidden_layers=1)  # save_pretrained drops them
    with pytest.raises(DrafterSpecError) as refused:
        build_drafter("mtp", load_target(folder))
    assert "holds no tensor under 'mtp.'" in str(refused.value) and "\n" not in str(refused.value)


def test_mtp_weights_of_another_shape_are_refused(tmp_path):
    """An MTP layer written for a target twice as wide: refused naming the tensors, nothing loaded."""
    folder = save_tiny_target(tmp_path / "narrow", "qwen3_5", mtp_num_hidden_layers=1)
    wide = save_mtp_target(tmp_path / "wide", "qwen3_5")
    config = json.loads((wide / "config.json").read_text())
    from safetensors.torch import load_file, save_file

    weights = load_file(str(folder / "model.safetensors"))
    theirs = load_file(str(wide / "model.safetensors"))
    weights.update({k: torch.cat([v, v], dim=-1) if v.ndim == 2 else v for k, v in theirs.items()
                    if k.startswith("mtp.")})
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    assert config["mtp_num_hidden_layers"] == 1
    with pytest.raises(DrafterSpecError) as refused:
        build_drafter("mtp", load_target(folder))
    assert "do not fit" in str(refused.value) or "does not match" in str(refused.value)
    assert "\n" not in str(refused.value)


def test_bad_mtp_options_are_one_line(mtp_dirs):
    target = load_target(mtp_dirs["qwen3_5"])
    for spec, words in (("mtp:depth=3", "unknown mtp option"), ("mtp:k=two", "bad mtp option")):
        with pytest.raises(DrafterSpecError) as refused:
            build_drafter(spec, target)
        assert words in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize("family", ["deepseek_v3", "deepseek_v32", "glm4_moe"])
def test_deepseek_forms_ship_the_layer_after_the_last_one(mtp_dirs, family):
    """DeepSeek-V3, V3.2 and GLM-4.5 keep MTP layer 0 as model.layers.{num_hidden_layers}: its own norms and
    projection, the shared head's norm, and a decoder layer with experts (as the real checkpoints' layer 61 and 92),
    V3.2's with its lightning indexer."""
    from safetensors import safe_open

    from draftsmith.serve.methods.mtp.from_target import shipped_head
    from draftsmith.serve.methods.mtp.shipped import checkpoint_files

    folder = mtp_dirs[family]
    target = load_target(folder)
    prefix = f"model.layers.{target.config.num_hidden_layers}."
    with safe_open(str(checkpoint_files(folder)[0]), "pt") as handle:
        names = {k[len(prefix):]: handle.get_tensor(k) for k in handle.keys() if k.startswith(prefix)}
    assert {"enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight",
            "mlp.experts.0.gate_proj.weight", "input_layernorm.weight"} <= set(names)
    state = shipped_head(target).state_dict()
    assert torch.equal(state["layers.0.eh_proj.weight"], names["eh_proj.weight"])
    assert torch.equal(state["layers.0.post_norm.weight"], names["shared_head.norm.weight"])
    assert shipped_head(target).config.norm_output  # the next step reads the normed output, as the engines recycle it
    if family == "deepseek_v32":
        assert torch.equal(state["layers.0.mtp_block.self_attn.indexer.wk.weight"],
                           names["self_attn.indexer.wk.weight"])


def test_a_deepseek_v32_layer_fine_tunes_and_drafts_exactly(mtp_dirs, tmp_path):
    """`train model.method=mtp` on a DeepSeek-V3.2 target starts from its shipped layer and moves it, all but its
    lightning indexer (transformers computes it without gradients: DSA trains it by a loss of its own), through an
    unroll whose cache keeps the indexer's keys; the tuned layer drafts exactly at batch 1 and 4."""
    from draftsmith.serve.core.config import load_config
    from draftsmith.serve.drafters.folder import load_head
    from draftsmith.serve.methods.mtp.from_target import shipped_head
    from draftsmith.train.config import TrainConfig
    from draftsmith.train.run import train_drafter
    from tests.train_fixtures import save_rows

    folder = mtp_dirs["deepseek_v32"]
    gen = torch.Generator().manual_seed(0)
    rows = [{"id": f"row{i}", "domain": "chat", "input_ids": torch.randint(0, 256, (24,), generator=gen).tolist(),
             "loss_mask": [0] * 4 + [1] * 20} for i in range(8)]
    config = load_config(TrainConfig, overrides=[
        f"target={folder}", f"data.dataset={save_rows(rows, tmp_path / 'data')}", f"out_dir={tmp_path / 'out'}",
        "model.method=mtp", "model.num_speculative_tokens=2", "model.ttt_steps=2", "optim.batch_size=4",
        "optim.max_steps=2", "optim.lr=1e-2", "data.eval_rows=2", "tracking=none", "log.progress=false",
        "checkpoint.every=0"])
    tuned = train_drafter(config)
    target = load_target(folder)
    before, after = shipped_head(target).state_dict(), load_head(tuned).state_dict()
    still = {k for k, v in before.items() if torch.equal(v, after[k].to(v.dtype))}
    assert {k for k in still if ".indexer." in k} == {k for k in before if ".indexer." in k}
    assert still - {k for k in before if ".indexer." in k} <= {"layers.0.mtp_block.mlp.gate.e_score_correction_bias"}
    prompts = _prompts(4, seed=1)
    plain = [plain_generate(target, torch.tensor([p]), max_new_tokens=16).output_ids for p in prompts]
    spec = speculative_generate(target, build_drafter(f"{tuned}:length=fixed", target), torch.tensor([prompts[0]]),
                                max_new_tokens=16, k=2)
    assert spec.output_ids == plain[0] and sum(spec.stats.drafted_per_cycle) > 0
    decoder = BatchDecoder(target, build_drafter(f"{tuned}:length=fixed", target), slots=4, k=2)
    for i, prompt in enumerate(prompts):
        decoder.add(Job(i, prompt, max_new_tokens=16))
    assert [f.result.output_ids for f in decoder.run()] == plain


def test_ernies_layer_reads_out_unnormed(mtp_dirs):
    """ERNIE-4.5 keeps model.mtp_{emb_norm,hidden_norm,linear_proj,block}.0 and no norm after the block: the target's
    lm_head and the next step read the block's output as it is, as vLLM's ernie_mtp.py and SGLang's ernie4_eagle.py
    draft (transformers' MtpModel puts the target's final norm there; vLLM's logits differ from that by 2.9)."""
    from safetensors import safe_open

    from draftsmith.serve.methods.mtp.from_target import shipped_head
    from draftsmith.serve.methods.mtp.shipped import checkpoint_files

    folder = mtp_dirs["ernie4_5_moe"]
    with safe_open(str(checkpoint_files(folder)[0]), "pt") as handle:
        names = {k for k in handle.keys() if k.startswith("model.mtp_")}
    assert {"model.mtp_emb_norm.0.weight", "model.mtp_hidden_norm.0.weight", "model.mtp_linear_proj.0.weight",
            "model.mtp_block.0.input_layernorm.weight"} <= names
    head = shipped_head(load_target(folder))
    assert head.layers[0].post_norm is None and not any("post_norm" in k for k in head.state_dict())
    out = torch.randn(2, 32)
    assert torch.equal(head.lm_head_input(out), out)


def test_nemotron_h_ships_its_step_as_blocks_under_mtp_layers(mtp_dirs, tmp_path):
    """Nemotron-H's MTP step is the blocks of its mtp_hybrid_override_pattern ("*E": attention, then experts), kept as
    mtp.layers.{i} under the target's own block names, the projections in the first and final_layernorm in the last
    (vLLM's nemotron_h_mtp.py); read back, each tensor is the head's, and written again, the checkpoint's."""
    from safetensors import safe_open

    from draftsmith.serve.methods.mtp.from_target import shipped_head
    from draftsmith.serve.methods.mtp.head import layer_config
    from draftsmith.serve.methods.mtp.shipped import NEMOTRON, checkpoint_files, head_state_to_checkpoint

    folder = mtp_dirs["nemotron_h"]
    target = load_target(folder)
    with safe_open(str(checkpoint_files(folder)[0]), "pt") as handle:
        keys = set(handle.keys())
        written = {k[len("mtp."):]: handle.get_tensor(k) for k in keys if k.startswith("mtp.")}
    full = target.config.layers_block_type.index("full_attention")
    own = {k.split(f"layers.{full}.", 1)[1] for k in keys if f"backbone.layers.{full}." in k}
    assert {k[len("layers.0."):] for k in written if k.startswith("layers.0.")} == \
        own | {"enorm.weight", "hnorm.weight", "eh_proj.weight"}  # the target's own attention block's names
    assert {"layers.1.norm.weight", "layers.1.mixer.gate.weight", "layers.1.mixer.gate.e_score_correction_bias",
            "layers.1.mixer.experts.3.up_proj.weight", "layers.1.mixer.experts.3.down_proj.weight",
            "layers.1.mixer.shared_experts.up_proj.weight", "layers.1.final_layernorm.weight"} <= set(written)
    assert not any(k.startswith("layers.2.") for k in written)
    head = shipped_head(target)
    state = head.state_dict()
    assert head.config.norm_output  # the next step reads final_layernorm's output, as vLLM returns it
    assert torch.equal(state["layers.0.eh_proj.weight"], written["layers.0.eh_proj.weight"])
    assert torch.equal(state["layers.0.post_norm.weight"], written["layers.1.final_layernorm.weight"])
    assert torch.equal(state["layers.0.mtp_block.0.mixer.q_proj.weight"], written["layers.0.mixer.q_proj.weight"])
    assert torch.equal(state["layers.0.mtp_block.1.mixer.experts.up_proj"][3],
                       written["layers.1.mixer.experts.3.up_proj.weight"])
    again = head_state_to_checkpoint(state, NEMOTRON, layer_config(head.config.layer_config))
    assert set(again) == set(written) and all(torch.equal(again[k], v) for k, v in written.items())


def test_a_nemotron_h_export_replaces_the_steps_blocks(mtp_dirs, tmp_path):
    """The merged export of a Nemotron-H MTP drafter: the shipped mtp.layers.{i}.* replaced by the drafter's, under
    the same names, read back drafting as the native drafter does."""
    from safetensors import safe_open

    from draftsmith.serve.drafters.folder import save_drafter
    from draftsmith.serve.export import export_drafter
    from draftsmith.serve.methods.mtp.head import MtpHead, mtp_config
    from draftsmith.serve.methods.mtp.shipped import INDEX

    folder = mtp_dirs["nemotron_h"]
    target = load_target(folder)
    torch.manual_seed(5)
    cfg = mtp_config(target, num_speculative_tokens=2, ttt_steps=2, norm_output=True)
    drafter = save_drafter(MtpHead(cfg), cfg, tmp_path / "drafter")
    report = export_drafter(drafter, "vllm", tmp_path / "out", target=target, max_new_tokens=12)
    assert report.mu_native == report.mu_readback and report.proposals_compared > 0
    shipped = {k for k in json.loads((tmp_path / "out" / INDEX).read_text())["weight_map"] if k.startswith("mtp.")}
    with safe_open(str(folder / "model.safetensors"), "pt") as handle:
        assert shipped == {k for k in handle.keys() if k.startswith("mtp.")}


def test_a_family_whose_mtp_form_is_not_read_says_so(tmp_path):
    """A config that names MTP layers of a family draftsmith keeps no form for (a Llama config given a count)."""
    target = load_target(save_tiny_target(tmp_path / "llama", "llama", num_nextn_predict_layers=1))
    with pytest.raises(DrafterSpecError) as refused:
        build_drafter("mtp", target)
    assert "does not read" in str(refused.value) and "model.method=mtp" in str(refused.value)
    assert "Nemotron-H" in str(refused.value) and "MiMo-V2" in str(refused.value)  # among the forms it reads
    assert "\n" not in str(refused.value)


def test_mimo_ships_its_layer_under_model_mtp_layers_without_a_count(mtp_dirs, tmp_path):
    """MiMo-V2-Flash keeps MTP layer i as model.mtp.layers.{i} (vLLM's mimo_v2_mtp.py names: pre_mlp_layernorm,
    attention_sink_bias, final_layernorm) and its config names no count: the checkpoint's tensors say it ships one.
    Read back, each tensor is the head's, and written again, the checkpoint's; a MiMo target without them ships
    none."""
    from safetensors import safe_open

    from draftsmith.serve.methods.mtp.from_target import shipped_head
    from draftsmith.serve.methods.mtp.head import layer_config
    from draftsmith.serve.methods.mtp.shipped import MIMO, checkpoint_files, head_state_to_checkpoint, named_count

    folder = mtp_dirs["mimo_v2_flash"]
    target = load_target(folder)
    assert named_count(target.config) == 0
    with safe_open(str(checkpoint_files(folder)[0]), "pt") as handle:
        written = {k[len("model.mtp.layers.0."):]: handle.get_tensor(k) for k in handle.keys()
                   if k.startswith("model.mtp.")}
    assert {"enorm.weight", "hnorm.weight", "eh_proj.weight", "final_layernorm.weight", "input_layernorm.weight",
            "pre_mlp_layernorm.weight", "self_attn.attention_sink_bias", "self_attn.k_proj.weight",
            "mlp.gate_proj.weight"} <= set(written)
    head = shipped_head(target)
    state = head.state_dict()
    assert torch.equal(state["layers.0.post_norm.weight"], written["final_layernorm.weight"])
    assert torch.equal(state["layers.0.mtp_block.post_attention_layernorm.weight"], written["pre_mlp_layernorm.weight"])
    assert torch.equal(state["layers.0.mtp_block.self_attn.sinks"], written["self_attn.attention_sink_bias"])
    assert head.window == 8 and head.config.norm_output  # the sliding layers' window; final_layernorm fed back
    again = head_state_to_checkpoint(state, MIMO, layer_config(head.config.layer_config))
    assert set(again) == set(written) and all(torch.equal(again[k], v) for k, v in written.items())
    bare = load_target(save_tiny_target(tmp_path / "bare", "mimo_v2_flash"))
    with pytest.raises(DrafterSpecError, match="ships no MTP layer .its checkpoint holds no tensor under"):
        build_drafter("mtp", bare)


def test_mimos_layer_attends_within_its_window(mtp_dirs):
    """MiMo-V2's MTP layer is one of its sliding-window layers (window 8 in the tiny target, the query's own
    included). Past the window, a row's chain and the rows of a batch drafting together propose what transformers'
    own sliding layer proposes (a one-layer MiMoV2FlashModel holding the MTP block, its mask from transformers'
    sliding-window mask, run over the whole sequence of pairs at every step), and the first draft's logits differ from
    that layer's without its window."""
    from transformers import AutoModel

    from draftsmith.serve.core.layers import FINAL
    from draftsmith.serve.drafters.eagle_drafter import EagleDrafter
    from draftsmith.serve.methods.mtp.head import layer_config

    target = load_target(mtp_dirs["mimo_v2_flash"])
    drafter = build_drafter("mtp:length=fixed,leaves=0", target)
    head = drafter.head
    lm_head, embed = target.model.get_output_embeddings(), target.model.get_input_embeddings()

    def reference(window: int | None):
        config = layer_config(head.config.layer_config)
        config._attn_implementation = "eager"
        config.sliding_window = window or 10 ** 6
        model = AutoModel.from_config(config).eval()
        block = {f"layers.0.{k}": v for k, v in head.layers[0].mtp_block.state_dict().items()}
        missing, unexpected = model.load_state_dict({**block, "norm.weight": head.layers[0].post_norm.weight},
                                                    strict=False)
        assert missing == ["embed_tokens.weight"] and not unexpected
        return model

    def chain(model, features, tokens, k=3):
        """The layer over every pair (feature t, token t+1) so far, drafting k tokens: (tokens, first logits)."""
        layer, drafted, first = head.layers[0], [], None
        for _ in range(k):
            x = layer.eh_proj(torch.cat([layer.enorm(embed(tokens)), layer.hnorm(features)], dim=-1))[None]
            out = model(inputs_embeds=x, position_ids=torch.arange(tokens.numel())[None]).last_hidden_state[0]
            logits = lm_head(out[-1])
            first = logits if first is None else first
            drafted.append(int(logits.argmax()))
            features, tokens = torch.cat([features, out[-1:]]), torch.cat([tokens, torch.tensor(drafted[-1:])])
        return drafted, first

    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 256, (n,), generator=gen) for n in (30, 21)]
    rows, together, expected = [], [], []
    with torch.no_grad():
        for prompt in prompts:
            out = target.model(prompt[None], output_hidden_states=True)
            features, pending = out.hidden_states[-1][0], out.logits[0, -1].argmax()[None]
            next_tokens = torch.cat([prompt[1:], pending])
            rows.append(drafter.fork())
            rows[-1].begin(prompt, next_tokens, {FINAL: features})
            together.append(drafter.fork())  # its cache holds all but the last 4 pairs, which it runs with the batch
            together[-1].begin(prompt[:-4], next_tokens[:-4], {FINAL: features[:-4]})
            assert together[-1]._logits is not None
            together[-1].commit(next_tokens[-4:], {FINAL: features[-4:]})
            tokens, logits = chain(reference(head.window), features, next_tokens)
            expected.append(tokens)
            assert torch.allclose(rows[-1]._logits, logits.float(), atol=1e-5)
            _, unwindowed = chain(reference(None), features, next_tokens, k=1)
            assert (rows[-1]._logits - unwindowed).abs().max() > 1e-2  # the window matters here
    assert [d.propose(3).tokens.tolist() for d in rows] == expected
    drafts = EagleDrafter.propose_rows(together, [{"k": 3}, {"k": 3}])
    assert [d.tokens.tolist() for d in drafts] == expected
