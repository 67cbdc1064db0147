"""`serve --record` -> `data build --traffic` / `train data.dataset=DIR` (a refresh from the drafter's weights)
-> `eval --prompts DIR`, end to end on a tiny target (loopback only)."""
from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from safetensors.torch import load_file

from draftsmith.cli import main
from draftsmith.serve.server import ServeConfig, build_app
from draftsmith.serve.core.traffic import TrafficError, TrafficRecorder, read_traffic, traffic_rows
from draftsmith.serve.core.target import load_target
from draftsmith.serve.core.target_config import TargetConfig
from tests.server_fixtures import running_server
from tests.train_fixtures import EAGLE3_LAYERS, sharp_target

ROOT = Path(__file__).resolve().parents[1]
QUESTIONS = {"code": ["def add(a, b):", "for i in range(3):", "print('hi')"], "math": ["2+2=", "7*6="]}


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    return sharp_target(tmp_path_factory.mktemp("target"), num_hidden_layers=EAGLE3_LAYERS)


@pytest.fixture(scope="module")
def recorded(target_dir, tmp_path_factory):
    """A recording server answered 5 chat requests in two domains, one completion, and one opted-out request."""
    folder = tmp_path_factory.mktemp("traffic") / "rec"
    config = ServeConfig(target=TargetConfig(spec=str(target_dir)), drafter="ngram", record=str(folder), record_segment_mb=0.001)
    with running_server(build_app(config)) as url:
        model = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
        for domain, questions in QUESTIONS.items():
            for q in questions:
                body = {"model": model, "messages": [{"role": "user", "content": q}], "max_tokens": 24,
                        "temperature": 0, "metadata": {"domain": domain}}
                assert httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60).status_code == 200
        body = {"model": model, "messages": [{"role": "user", "content": "my secret password"}], "max_tokens": 8,
                "store": False}
        assert httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60).status_code == 200
        body = {"model": model, "prompt": "Once upon", "max_tokens": 8, "temperature": 0}
        assert httpx.post(f"{url}/v1/completions", json=body, timeout=60).status_code == 200
    return folder


def test_recording_keeps_what_was_served(recorded, target_dir):
    records = list(read_traffic(recorded))
    assert len(records) == 6 and [r["domain"] for r in records] == ["code"] * 3 + ["math"] * 2 + ["default"]
    assert len(list(recorded.glob("traffic-*.jsonl"))) > 1  # segments of ~1 KB rotate
    assert "secret" not in "".join(p.read_text() for p in recorded.glob("*.json*"))  # the opted-out request
    summary = json.loads((recorded / "summary.json").read_text())
    assert summary["requests"] == 6 and summary["not_recorded"] == 1
    assert summary["domains"]["code"]["requests"] == 3 and summary["domains"]["math"]["requests"] == 2
    chat = records[0]
    assert chat["messages"] == [{"role": "user", "content": "def add(a, b):"}] and chat["endpoint"] == "chat"
    assert chat["sampling"]["temperature"] == 0 and chat["sampling"]["max_tokens"] == 24 and chat["time"] > 0
    assert records[-1]["prompt"] == "Once upon" and records[-1]["messages"] is None
    # what was recorded is the target's own output for the prompt it saw
    from draftsmith.serve.decoding import plain_generate

    import torch

    target = load_target(target_dir)
    plain = plain_generate(target, torch.tensor([chat["prompt_token_ids"]]), max_new_tokens=24).output_ids
    assert chat["output_token_ids"] == plain
    rows = traffic_rows(recorded, tokenizer_hash=target.tokenizer_hash)
    assert rows["input_ids"][0] == chat["prompt_token_ids"] + plain
    assert rows["loss_mask"][0] == [0] * len(chat["prompt_token_ids"]) + [1] * len(plain)


def test_a_recording_of_another_target_is_refused(recorded, tmp_path):
    other = load_target(sharp_target(tmp_path / "other", num_hidden_layers=2))
    with pytest.raises(TrafficError, match="holds traffic of target"):
        TrafficRecorder(recorded, target=other)


def test_data_build_merges_the_traffic_as_served(recorded, target_dir, tmp_path):
    import datasets

    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "a", "domain": "chat", "prompt": "hello"}) + "\n")
    out = tmp_path / "ds"
    assert main(["data", "build", "--target", str(target_dir), "--prompts", str(prompts), "--traffic", str(recorded),
                 "--out", str(out), "--no-progress", "data.max_new_tokens=8", "data.max_length=256"]) == 0
    data = datasets.load_from_disk(str(out)).to_dict()
    assert data["id"][0] == "a" and len(data["id"]) == 7
    served = traffic_rows(recorded)
    assert data["input_ids"][1:] == served["input_ids"] and data["loss_mask"][1:] == served["loss_mask"]
    assert json.loads((out / "build_info.json").read_text())["counts"]["traffic_rows"] == 6


def test_train_on_traffic_then_refresh_then_eval_before_and_after(recorded, target_dir, tmp_path, capsys):
    tiny = str(ROOT / "configs/debug/tiny.yaml")
    common = [f"target={target_dir}", f"data.dataset={recorded}", "data.eval_rows=1"]
    assert main(["train", "--config", tiny, *common, f"out_dir={tmp_path / 'before'}"]) == 0
    before = tmp_path / "before" / "drafter"
    # a refresh with lr 0 must give back the drafter it started from: training continued from its weights
    assert main(["train", "--config", tiny, *common, f"model.init_from={before}", "optim.lr=0.0",
                 f"out_dir={tmp_path / 'same'}"]) == 0
    same = load_file(str(tmp_path / "same" / "drafter" / "model.safetensors"))
    assert all((same[k] == v).all() for k, v in load_file(str(before / "model.safetensors")).items())
    assert main(["train", "--config", tiny, *common, f"model.init_from={before}", f"out_dir={tmp_path / 'after'}"]) == 0
    after = tmp_path / "after" / "drafter"
    capsys.readouterr()
    out = tmp_path / "eval.json"
    assert main(["eval", "--target", str(target_dir), "--drafter", f"before={before}", "--drafter", f"after={after}",
                 "--prompts", str(recorded), "--max-new-tokens", "16", "--no-peers", "--no-cost-model", "--quiet",
                 "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    text = json.dumps(result)
    assert '"before"' in text and '"after"' in text and '"code"' in text and '"math"' in text


def test_a_refresh_of_another_method_is_refused(recorded, target_dir, tmp_path, capsys):
    tiny = str(ROOT / "configs/debug/tiny.yaml")
    common = [f"target={target_dir}", f"data.dataset={recorded}", "data.eval_rows=1"]
    assert main(["train", "--config", tiny, *common, f"out_dir={tmp_path / 'e3'}"]) == 0
    with pytest.raises(SystemExit):
        main(["train", "--config", tiny, *common, "model.method=medusa",
              f"model.init_from={tmp_path / 'e3' / 'drafter'}", f"out_dir={tmp_path / 'm'}"])
    assert "is an eagle3 drafter but model.method=medusa" in capsys.readouterr().err
