"""Self-distillation build on tiny targets: output, resume, multi-turn, long prompts, bad input."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from draftsmith.data.build import build_dataset, unmask_cut_endings
from draftsmith.data.config import DataBuildConfig
from draftsmith.serve.core.config import ConfigError, load_config
from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.core.target import load_target
from tests.data_fixtures import PROMPTS, config_for, prompts, quiet, read, write_jsonl  # noqa: F401  (prompts is a fixture)

def runs(mask):
    return sum(1 for k in range(len(mask)) if mask[k] and (k == 0 or not mask[k - 1]))


def test_build_writes_dataset_masks_and_info(tmp_path, tiny_target, prompts):
    out = tmp_path / "ds"
    result = build_dataset(tiny_target, config_for(prompts, draft_vocab_size=64), out_dir=out, progress=False, log=quiet)
    data = read(out)
    assert data["id"] == ["a", "b", "c", "d", "e"]  # the prompts' order, not the batches'
    assert data["domain"] == ["math", "code", "math", "chat", "chat"]
    tok = tiny_target.tokenizer
    for ids, mask in zip(data["input_ids"], data["loss_mask"]):
        assert len(ids) == len(mask) and set(mask) <= {0, 1} and any(mask)
        assert tok.decode(ids).startswith("<|im_start|>user\n")
    # multi-turn rows: every assistant turn is written by the target and trained
    assert runs(data["loss_mask"][3]) == 2 and runs(data["loss_mask"][4]) == 2
    assert "given answer" not in tok.decode(data["input_ids"][4])  # regenerate=true replaces given answers
    info = json.loads((out / "build_info.json").read_text())
    assert info["target"]["tokenizer_hash"] == tiny_target.tokenizer_hash
    assert info["target"]["config_hash"] == tiny_target.config_hash
    assert info["target"]["weights"] and info["target"]["hidden_size"] == 32  # what train compares (data/made_for.py)
    assert info["rows"] == 5 and info["counts"]["prompts"] == 5 and info["domains"]["math"] == 2
    assert result.generated_tokens > 0 and result.tokens == sum(map(len, data["input_ids"]))
    assert (out / "config.resolved.yaml").is_file() and 0 < result.draft_vocab_coverage <= 1
    assert not (out / "draft_vocab.safetensors").exists()  # training picks its own from its training rows
    assert result.loss_tokens == sum(map(sum, data["loss_mask"]))


def test_keep_given_answers(tmp_path, tiny_target, prompts):
    out = tmp_path / "keep"
    build_dataset(tiny_target, config_for(prompts, regenerate=False), out_dir=out, progress=False, log=quiet)
    data = read(out)
    ids, mask = data["input_ids"][4], data["loss_mask"][4]
    assert "given answer" in tiny_target.tokenizer.decode([i for i, m in zip(ids, mask) if m])


def test_resume_after_interruption_equals_uninterrupted(tmp_path, tiny_target, prompts):
    config = config_for(prompts, temperature=0.9, top_k=20, seed=7)
    build_dataset(tiny_target, config, out_dir=tmp_path / "full", progress=False, log=quiet)

    class Killed(Exception):
        pass

    def kill_after_second(index: int) -> None:
        if index == 1:
            raise Killed

    out = tmp_path / "resumed"
    with pytest.raises(Killed):
        build_dataset(tiny_target, config, out_dir=out, progress=False, log=quiet, on_batch=kill_after_second)
    assert not (out / "dataset_info.json").exists() and len(list((out / ".work").glob("part-*.jsonl"))) == 2
    result = build_dataset(tiny_target, config, out_dir=out, progress=False, log=quiet)
    assert (result.reused_batches, result.reused_rows, result.generated_batches) == (2, 4, 1)
    assert read(out) == read(tmp_path / "full")
    info = [json.loads((d / "build_info.json").read_text()) for d in (out, tmp_path / "full")]
    assert info[0]["counts"] == info[1]["counts"] and info[0]["counts"]["unfinished_answers"] > 0
    again = build_dataset(tiny_target, config, out_dir=out, progress=False, log=quiet)
    assert (again.reused_rows, again.generated_batches) == (5, 0) and read(out) == read(tmp_path / "full")
    with pytest.raises(DraftsmithError, match=r"other inputs \(changed: settings, data.max_new_tokens\)"):
        build_dataset(tiny_target, replace(config, max_new_tokens=5), out_dir=out, progress=False, log=quiet)


def test_resume_with_a_smaller_batch(tmp_path, tiny_target, prompts):
    config = config_for(prompts, batch_size=3)
    out = tmp_path / "ds"

    def kill(part: int) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        build_dataset(tiny_target, config, out_dir=out, progress=False, log=quiet, on_batch=kill)
    result = build_dataset(tiny_target, replace(config, batch_size=1), out_dir=out, progress=False, log=quiet)
    assert (result.reused_rows, result.generated_batches) == (3, 2)
    assert sorted(p.name for p in (out / ".work").glob("part-*.jsonl")) == [
        "part-00000.jsonl", "part-00001.jsonl", "part-00002.jsonl"]
    assert read(out)["id"] == ["a", "b", "c", "d", "e"]


def test_long_prompts_skipped_or_truncated(tmp_path, tiny_target):
    src = write_jsonl(tmp_path / "long.jsonl", [{"id": "short", "prompt": "ok"},
                                                {"id": "long", "prompt": "word " * 60}])
    cfg = config_for(src, max_length=48, max_new_tokens=8)
    skipped = build_dataset(tiny_target, cfg, out_dir=tmp_path / "skip", progress=False, log=quiet)
    assert skipped.counts["skipped_long_prompts"] == 1 and read(tmp_path / "skip")["id"] == ["short"]
    truncated = build_dataset(tiny_target, replace(cfg, long_prompts="truncate"), out_dir=tmp_path / "trunc",
                              progress=False, log=quiet)
    data = read(tmp_path / "trunc")
    assert truncated.counts["truncated_prompts"] == 1 and data["id"] == ["short", "long"]
    assert all(len(ids) <= 48 for ids in data["input_ids"])
    assert "word word" in tiny_target.tokenizer.decode(data["input_ids"][1])


def test_target_without_chat_template(tmp_path, tiny_target_factory, prompts):
    from tests.tiny_models import save_tiny_target

    base = load_target(save_tiny_target(tmp_path / "base", "llama", chat_template=None))
    with pytest.raises(DraftsmithError, match="no chat template.*data.chat=false"):
        build_dataset(base, config_for(prompts), out_dir=tmp_path / "x", progress=False, log=quiet)
    assert not (tmp_path / "x").exists()  # refused before any work
    build_dataset(base, config_for(prompts, chat=False), out_dir=tmp_path / "plain", progress=False, log=quiet)
    data = read(tmp_path / "plain")
    first = base.tokenizer.decode(data["input_ids"][0])
    assert first.startswith("1+1?") and "<|im_start|>" not in first


def test_cut_answers_do_not_train_end_of_turn():
    eos = [9]
    messages = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"},
                {"role": "user", "content": "v"}, {"role": "assistant", "content": "b"}]
    ids = [1, 2, 3, 9, 4, 5, 6, 9, 4]
    mask = [0, 0, 1, 1, 0, 0, 1, 1, 0]
    unmask_cut_endings(ids, mask, messages, [1], eos_token_ids=eos)
    assert mask == [0, 0, 1, 0, 0, 0, 1, 1, 0]


def test_config_errors(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("data:\n  max_new_tokens: 32\ncapture:\n  dtype: fp16\n")
    assert load_config(DataBuildConfig, section="data", config_file=recipe).max_new_tokens == 32
    with pytest.raises(ConfigError, match="max_new_tokenz.*valid keys here:.*max_new_tokens"):
        load_config(DataBuildConfig, section="data", overrides=["data.max_new_tokenz=3"])
    with pytest.raises(ConfigError, match="not a `data.\\*` key"):
        load_config(DataBuildConfig, section="data", overrides=["capture.dtype=fp16"])
    with pytest.raises(ConfigError, match="long_prompts"):
        load_config(DataBuildConfig, section="data", overrides=["data.long_prompts=crash"])
    with pytest.raises(ConfigError, match="below data.max_length"):
        load_config(DataBuildConfig, section="data", overrides=["data.max_new_tokens=4096"])


def test_cli_reports_bad_prompt_file_in_one_line(tmp_path, tiny_target_dir, capsys):
    from draftsmith.cli import main

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"prompt": \n')
    with pytest.raises(SystemExit) as exit_info:
        main(["data", "build", "--target", str(tiny_target_dir), "--prompts", str(bad), "--out",
              str(tmp_path / "o"), "--no-progress"])
    assert exit_info.value.code == 2
    assert "bad.jsonl:2: not valid JSON" in capsys.readouterr().err


def test_recipes_load():
    from pathlib import Path

    from draftsmith.data.config import CaptureConfig

    recipes = sorted((Path(__file__).resolve().parents[1] / "configs" / "data").glob("*.yaml"))
    assert recipes
    for recipe in recipes:
        data = load_config(DataBuildConfig, section="data", config_file=recipe)
        capture = load_config(CaptureConfig, section="capture", config_file=recipe)
        assert data.prompts and capture.layers in ("eagle3", "eagle1", "medusa")


def test_a_growing_prompt_set_reuses_finished_rows(tmp_path, tiny_target):
    """More prompts (or another limit) keep the rows already answered; a prompt whose text changed is redone."""
    out = tmp_path / "ds"
    first = write_jsonl(tmp_path / "p1.jsonl", PROMPTS[:3])
    build_dataset(tiny_target, config_for(first), out_dir=out, progress=False, log=quiet)
    before = read(out)
    changed = [dict(PROMPTS[0], prompt="3+4?"), *PROMPTS[1:]]  # row "a" keeps its id but asks something else
    grown = build_dataset(tiny_target, config_for(write_jsonl(tmp_path / "p2.jsonl", changed)), out_dir=out,
                          progress=False, log=quiet)
    assert grown.reused_rows == 2 and grown.rows == 5  # b and c reused; a, d, e generated
    after = read(out)
    for row_id in ("b", "c"):
        old, new = before["id"].index(row_id), after["id"].index(row_id)
        assert after["input_ids"][new] == before["input_ids"][old]
    a_old, a_new = before["input_ids"][before["id"].index("a")], after["input_ids"][after["id"].index("a")]
    assert a_new != a_old
    with pytest.raises(DraftsmithError, match=r"other inputs \(changed: settings, data.max_new_tokens\)"):
        build_dataset(tiny_target, config_for(first, max_new_tokens=5), out_dir=out, progress=False, log=quiet)


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_rows_do_not_depend_on_the_batch_size(tmp_path, tiny_target, prompts, temperature):
    # continuous batching: a row's answer is the same whichever rows decode beside it (greedy, or sampled
    # from its own seed)
    config = config_for(prompts, temperature=temperature, seed=3, max_new_tokens=12)
    for batch_size in (1, 5):
        build_dataset(tiny_target, replace(config, batch_size=batch_size), out_dir=tmp_path / f"b{batch_size}",
                      progress=False, log=quiet)
    assert read(tmp_path / "b1") == read(tmp_path / "b5")


def test_keep_answers_mixes_fixed_text_rows_at_a_ratio(tmp_path, tiny_target):
    """data.keep_answers: that fraction of the rows carrying answers keeps them (teacher forcing, nothing
    generated for them); the rest are regenerated by the target. The choice follows the row id."""
    from draftsmith.data.plan import keeps_answers

    rows = [{"id": f"r{i}", "domain": "chat", "messages": [{"role": "user", "content": f"q{i}"},
                                                          {"role": "assistant", "content": f"written answer {i}"}]}
            for i in range(40)]
    prompts = write_jsonl(tmp_path / "answered.jsonl", rows)
    kept = {r["id"] for r in rows if keeps_answers(r["id"], 0.5)}
    assert 10 < len(kept) < 30  # about half
    out = tmp_path / "mixed"
    result = build_dataset(tiny_target, config_for(prompts, keep_answers=0.5, batch_size=8), out_dir=out,
                           progress=False, log=quiet)
    data = read(out)
    tok = tiny_target.tokenizer
    for row_id, ids, mask in zip(data["id"], data["input_ids"], data["loss_mask"]):
        trained = tok.decode([t for t, m in zip(ids, mask) if m])
        assert ("written answer" in trained) == (row_id in kept), row_id
    assert 0 < result.generated_tokens <= (40 - len(kept)) * 6  # only the regenerated rows were generated
    with pytest.raises(ConfigError, match="keep_answers"):
        load_config(DataBuildConfig, section="data", overrides=["data.keep_answers=1.5"])


def test_a_deadline_keeps_the_rows_answered_and_a_rerun_answers_the_rest(tmp_path, tiny_target, prompts,
                                                                         monkeypatch):
    """`demo --budget`: past the deadline no new row starts; the rows in flight end their turn (a conversation
    with turns left is not saved); a rerun without a deadline answers the others, equal to a build never cut, and a
    rerun past its deadline from the start answers none. The rows with the most answers to write start first:
    conversations d and e (two each) fill the two slots while a, b, c wait, so the deadline cuts single turns and
    no conversation is lost half-written."""
    import draftsmith.data.build as build

    config = config_for(prompts, max_new_tokens=4)
    full = tmp_path / "full"
    build_dataset(tiny_target, config, out_dir=full, progress=False, log=quiet)
    steps = []  # the deadline passes after 12 steps of the batcher
    monkeypatch.setattr(build.time, "monotonic", lambda: 0.0 if len(steps) < 12 else 10.0)
    step = build.ContinuousBatcher.step
    monkeypatch.setattr(build.ContinuousBatcher, "step", lambda self: steps.append(1) or step(self))
    out, lines = tmp_path / "cut", []
    cut = build_dataset(tiny_target, config, out_dir=out, progress=False, log=lines.append, deadline=5.0)
    monkeypatch.undo()
    assert 1 <= cut.rows < 5 and any("rows not started" in line for line in lines)
    assert {"d", "e"} <= set(read(out)["id"])
    assert set(read(out)["id"]) < set(read(full)["id"])
    kept = build_dataset(tiny_target, config, out_dir=out, progress=False, log=quiet, deadline=0.0)
    assert (kept.reused_rows, kept.generated_batches) == (cut.rows, 0) and read(out)["id"] == read(tmp_path / "cut")["id"]
    again = build_dataset(tiny_target, config, out_dir=out, progress=False, log=quiet)
    assert again.reused_rows == cut.rows and read(out) == read(full)

