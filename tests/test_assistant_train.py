"""Fine-tuning Gemma 4's assistant (serve/methods/gemma4_assistant/): on a tiny Gemma 4 target's own greedy text,
`train model.method=gemma4_assistant` from a shipped (tiny random) assistant lowers the loss and raises held-out
agreement over where it started, and a fresh one trains too; the batched objective is the drafter's own forward at
every position; the trained drafter folder decodes token for token as plain greedy decoding; `draftsmith export`
writes the assistant's transformers folder, which Gemma4AssistantForCausalLM.from_pretrained loads and which drafts
as the native drafter; another target's assistant, offline mode and a format without it are one line each."""
from __future__ import annotations

import json

import pytest
import torch

from draftsmith.serve.core.config import load_config
from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.core.layers import FINAL
from draftsmith.serve.core.target import load_target
from draftsmith.serve.decoding import plain_generate, speculative_generate
from draftsmith.serve.drafters import build_drafter
from draftsmith.serve.drafters.folder import load_head
from draftsmith.serve.methods.gemma4_assistant.drafter import store_layers
from draftsmith.serve.methods.gemma4_assistant.export import engine_tensor_names
from draftsmith.serve.methods.gemma4_assistant.head import AssistantHead, assistant_head_config
from draftsmith.serve.methods.gemma4_assistant.objective import assistant_objective
from draftsmith.serve.methods.objective import ObjectiveSettings, TargetParts
from draftsmith.train.config import TrainConfig
from draftsmith.train.features import collate
from draftsmith.train.run import train_drafter
from draftsmith.train.tracking import read_log
from tests.cli_fixtures import cli_error
from tests.test_assistant import save_assistant
from tests.train_fixtures import greedy_rows, save_rows, sharp_target

WINDOW = 8  # the target's sliding window: rows run past it


def looping_target(folder):
    """A tiny Gemma 4 target whose greedy text falls into loops, as the tiny Llama's does (tests/train_fixtures.py):
    Gemma's post-attention and post-feedforward norms make every layer's output as large as the token's embedding,
    and its random greedy text then has nothing a drafter can learn; damped, each state is mostly its token's."""
    from transformers import AutoModelForCausalLM

    folder = sharp_target(folder, family="gemma4", num_hidden_layers=4, sliding_window=WINDOW)
    model = AutoModelForCausalLM.from_pretrained(folder)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.post_attention_layernorm.weight.mul_(0.03)
            layer.post_feedforward_layernorm.weight.mul_(0.03)
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    root = tmp_path_factory.mktemp("assistant-train")
    target_dir = looping_target(root / "target")
    target = load_target(target_dir)
    held_out = greedy_rows(target_dir, rows=8, new_tokens=32, seed=1)
    return {"root": root, "target_dir": target_dir, "target": target,
            "data": save_rows(greedy_rows(target_dir, rows=48, new_tokens=32), root / "data"),
            "held_out": held_out, "assistant": save_assistant(root / "assistant", target.config)}


def _config(job, out: str, *extra: str) -> TrainConfig:
    return load_config(TrainConfig, overrides=[
        f"target={job['target_dir']}", f"data.dataset={job['data']}", f"out_dir={job['root'] / out}",
        "model.method=gemma4_assistant", "model.num_speculative_tokens=3", "model.ttt_steps=3", "optim.batch_size=8",
        "optim.max_steps=100", "optim.lr=3e-2", "data.eval_rows=4", "tracking=none", "log.progress=false",
        "log.every=5", "checkpoint.every=0", *extra])


def _agreement(head, job) -> dict:
    """Held-out top-1 agreement of `head` (the objective's draft_ids against the target's argmax) on rows that
    training never saw."""
    objective = assistant_objective(head, TargetParts.of(job["target"]), ObjectiveSettings())
    batch = collate(job["held_out"], max_length=64)
    batch.hidden_states = objective.target_forward(job["target"].model, batch.input_ids, batch.attention_mask,
                                                   (FINAL,))
    return objective.agreement(batch, 3).summary()


@pytest.fixture(scope="module")
def trained(job):
    return train_drafter(_config(job, "shipped", f"model.shipped_drafter={job['assistant']}"))


def test_the_batched_objective_is_the_drafters_forward_at_every_position(job):
    """Each row's logits (three steps, positions past the sliding window) equal the assistant run as the drafter
    runs it: one query over the target's cache of the text so far, the sliding layer cut to window - 1."""
    from transformers import DynamicCache

    target = job["target"]
    head = AssistantHead(assistant_head_config(target, num_speculative_tokens=3, ttt_steps=3,
                                               shipped=str(job["assistant"])))
    assert head.start_from_target(target)
    objective = assistant_objective(head, TargetParts.of(target), ObjectiveSettings())
    ids = torch.tensor([job["held_out"][0]["input_ids"][:16]])
    features = objective.target_forward(target.model, ids, torch.ones_like(ids), (FINAL,))
    with torch.no_grad():
        steps = [head.logits(last, as_drafted=True) for last in objective._unroll(ids, features, 3)]
    embed = target.model.get_input_embeddings()
    for t in (0, 5, 11):
        cache = DynamicCache(config=target.model.config)
        out = target.model(ids[:, :t + 1], cache=cache, use_cache=True, output_hidden_states=True)
        kv = {}
        for kind, index in store_layers(target.model.config.get_text_config()).items():
            layer = cache.layers[index]
            cut = -(layer.sliding_window - 1) if getattr(layer, "is_sliding", False) else 0
            kv[kind] = (layer.keys[:, :, cut:], layer.values[:, :, cut:])
        hidden = out.hidden_states[-1][:, -1:]
        with torch.no_grad():
            for j in range(3):
                step = head.assistant(inputs_embeds=torch.cat([embed(ids[:, t + 1 + j:t + 2 + j]), hidden], -1),
                                      position_ids=torch.tensor([[t + 1]]), shared_kv_states=kv)
                torch.testing.assert_close(step.logits[0, 0], steps[j][0, t], atol=1e-4, rtol=1e-4)
                hidden = step.last_hidden_state


def test_training_lowers_the_loss_and_raises_held_out_agreement(job, trained):
    log = [r for r in read_log(job["root"] / "shipped") if "loss" in r]
    assert log[-1]["loss"] < 0.8 * log[0]["loss"], (log[0], log[-1])
    start = AssistantHead(assistant_head_config(job["target"], num_speculative_tokens=3, ttt_steps=3,
                                                shipped=str(job["assistant"])))
    start.start_from_target(job["target"])
    before, after = _agreement(start, job), _agreement(load_head(trained), job)
    assert after["agreement"][0] > before["agreement"][0] + 0.25, (before, after)
    assert after["mu_tf"] > before["mu_tf"] + 0.3, (before, after)
    config = json.loads((trained / "config.json").read_text())
    assert config["method"] == "gemma4_assistant" and config["layer_config"]["start_from"] == str(job["assistant"])


def test_the_trained_drafter_decodes_as_plain_greedy(job, trained):
    target = job["target"]
    drafter = build_drafter(f"{trained}:length=fixed", target)
    accepted = 0
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.tensor([row["input_ids"][:6]]) for row in job["held_out"][:2]]
    prompts.append(torch.randint(0, 256, (1, 2 * WINDOW), generator=gen))
    for prompt in prompts:
        plain = plain_generate(target, prompt, max_new_tokens=20)
        spec = speculative_generate(target, drafter, prompt, max_new_tokens=20, k=3)
        assert spec.output_ids == plain.output_ids
        accepted += sum(spec.stats.accepted_per_cycle)
    assert accepted > 0


def test_a_fresh_assistant_trains_and_drafts_exactly(job):
    """No shipped assistant: one built for the target (model.draft_layers layers, the last full attention)."""
    drafter_dir = train_drafter(_config(job, "fresh", "model.draft_layers=2", "optim.max_steps=15"))
    config = json.loads((drafter_dir / "config.json").read_text())
    assert config["layer_config"]["assistant"]["text_config"]["layer_types"] == ["sliding_attention",
                                                                                  "full_attention"]
    log = [r for r in read_log(job["root"] / "fresh") if "loss" in r]
    assert log[-1]["loss"] < log[0]["loss"]
    target = job["target"]
    prompt = torch.tensor([job["held_out"][1]["input_ids"][:6]])
    spec = speculative_generate(target, build_drafter(f"{drafter_dir}:length=fixed", target), prompt,
                                max_new_tokens=16, k=3)
    assert spec.output_ids == plain_generate(target, prompt, max_new_tokens=16).output_ids


def test_export_is_the_assistants_transformers_folder_drafting_as_the_native(job, trained, capsys):
    from transformers import Gemma4AssistantForCausalLM
    from safetensors import safe_open

    from draftsmith.cli import main

    target = job["target"]
    for fmt in ("vllm", "sglang"):
        out = job["root"] / f"export-{fmt}"
        assert main(["export", "--drafter", str(trained), "--format", fmt, "--out", str(out), "--prompts", "2",
                     "--max-new-tokens", "12", "--k", "3"]) == 0
        report = json.loads((out / "export_report.json").read_text())
        assert report["proposals_compared"] > 0 and report["mu_readback"] == report["mu_native"]
        assert json.loads((out / "config.json").read_text())["model_type"] == "gemma4_assistant"
        model = Gemma4AssistantForCausalLM.from_pretrained(out)
        with safe_open(str(out / "model.safetensors"), framework="pt") as handle:
            assert set(handle.keys()) == engine_tensor_names(model.config)
    native, readback = (build_drafter(spec, target) for spec in (f"{trained}:length=fixed",
                                                                 f"gemma4_assistant:{out}:length=fixed"))
    prompt = torch.tensor([job["held_out"][2]["input_ids"][:6]])
    runs = [speculative_generate(target, d, prompt, max_new_tokens=16, k=3) for d in (native, readback)]
    assert runs[0].output_ids == runs[1].output_ids == plain_generate(target, prompt, max_new_tokens=16).output_ids
    assert runs[0].stats.accepted_per_cycle == runs[1].stats.accepted_per_cycle
    line = cli_error(capsys, "export", "--drafter", trained, "--format", "speculators", "--out",
                     job["root"] / "export-spec")
    assert "cannot export a Gemma 4 assistant" in line and "--format vllm or sglang" in line


def test_bad_input_is_one_line(job, trained, capsys):
    root = job["root"]
    wider = save_assistant(root / "wider", job["target"].config, backbone_hidden_size=48)
    line = cli_error(capsys, "train", f"target={job['target_dir']}", f"data.dataset={job['data']}",
                     f"out_dir={root / 'wider-run'}", "model.method=gemma4_assistant", f"model.shipped_drafter={wider}",
                     "tracking=none")
    assert line.startswith("error: ") and "hidden size 48" in line and "another target's assistant" in line, line
    assert not (root / "wider-run").exists()
    with pytest.raises(DraftsmithError) as err:
        train_drafter(_config(job, "native", f"model.shipped_drafter={trained}"))
    assert f"model.init_from={trained}" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(DraftsmithError) as err:
        build_drafter(f"gemma4_assistant:{trained}", job["target"])
    assert "is a draftsmith drafter folder" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(DraftsmithError) as err:
        train_drafter(_config(job, "missing", f"model.shipped_drafter={root / 'nothing'}"))
    assert "no such folder" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(DraftsmithError) as err:
        load_config(TrainConfig, overrides=[f"target={job['target_dir']}", "model.method=gemma4_assistant",
                                            "data.mode=offline", f"data.cache={root / 'cache'}"])
    assert "online only" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(DraftsmithError) as err:
        load_config(TrainConfig, overrides=["model.method=eagle3", f"model.shipped_drafter={job['assistant']}"])
    assert "model.shipped_drafter is an option of Gemma 4 assistant" in str(err.value)


def test_an_assistant_with_ordered_embeddings_trains_and_exports(job):
    """use_ordered_embeddings (Google's assistants): drafts score only the tokens of the top centroids; training
    reaches its lm_head over the whole vocabulary and keeps the centroids and the token order as shipped."""
    from safetensors.torch import load_file

    from draftsmith.serve.export import export_drafter
    from tests.test_assistant import assistant_model

    target, root = job["target"], job["root"]
    vocab = target.config.get_text_config().vocab_size
    model = assistant_model(target.config, use_ordered_embeddings=True, num_centroids=7, centroid_intermediate_top_k=3)
    with torch.no_grad():
        model.masked_embedding.token_ordering.copy_(torch.randperm(vocab, generator=torch.Generator().manual_seed(0)))
    model.save_pretrained(root / "ordered")
    drafter_dir = train_drafter(_config(job, "ordered-run", f"model.shipped_drafter={root / 'ordered'}",
                                        "optim.max_steps=20"))
    log = [r for r in read_log(root / "ordered-run") if "loss" in r]
    assert log[-1]["loss"] < log[0]["loss"]
    trained = load_file(str(drafter_dir / "model.safetensors"))
    shipped = model.state_dict()
    for name in ("masked_embedding.centroids.weight", "masked_embedding.token_ordering"):
        assert torch.equal(trained[name], shipped[name]), name
    assert not torch.equal(trained["pre_projection.weight"], shipped["pre_projection.weight"])
    out = root / "ordered-export"
    report = export_drafter(drafter_dir, "vllm", out, target=target, k=3, max_new_tokens=12,
                            prompts=[torch.tensor([row["input_ids"][:6]]) for row in job["held_out"][:2]])
    assert report.proposals_compared > 0
    prompt = torch.tensor([job["held_out"][3]["input_ids"][:6]])
    plain = plain_generate(target, prompt, max_new_tokens=16).output_ids
    for spec in (f"{drafter_dir}:length=fixed", f"gemma4_assistant:{out}:length=fixed"):
        assert speculative_generate(target, build_drafter(spec, target), prompt, max_new_tokens=16,
                                    k=3).output_ids == plain
