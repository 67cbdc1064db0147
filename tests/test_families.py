"""Every family users fine-tune: EAGLE-3 and EAGLE-1 heads train on a tiny target of the family, draft with output
identical to plain greedy decoding, are built on the Llama layer the engines serve, and export in every format whose
engine can host the family (read back with μ equal to the native drafter's); where an engine cannot host it, the
export stops with one line naming the engine and what its target class lacks, and writes nothing."""
from __future__ import annotations

import json

import pytest
import torch

from serve.config import load_config
from serve.decoding import plain_generate, speculative_generate
from serve.drafters import build_drafter
from serve.errors import DraftsmithError
from serve.export import export_drafter
from serve.export.common import default_prompts
from serve.export.hosts import HOSTS
from serve.target import load_target, text_config
from tests.train_fixtures import greedy_rows, save_rows, sharp_target
from train.config import TrainConfig
from train.run import train_drafter

FAMILIES = ["llama", "qwen2", "qwen3", "qwen3_moe", "mistral", "gemma", "phi3", "gpt_oss"]
FORMATS = {"eagle3": ("vllm", "sglang", "speculators"), "eagle1": ("vllm", "sglang")}


def _train(target_dir, dataset, out_dir, method: str):
    return train_drafter(load_config(TrainConfig, overrides=[
        f"target={target_dir}", f"data.dataset={dataset}", f"out_dir={out_dir}", f"model.method={method}",
        "model.num_speculative_tokens=3", "model.ttt_steps=2", "optim.batch_size=8", "optim.max_steps=12",
        "optim.lr=1e-2", "data.eval_rows=4", "tracking=none", "log.progress=false", "log.every=20",
        "checkpoint.every=0", *(("model.draft_vocab_size=200",) if method == "eagle3" else ())]))


@pytest.mark.parametrize("family", FAMILIES)
def test_family_trains_drafts_exactly_and_exports(family, tmp_path):
    target_dir = sharp_target(tmp_path / "target", family=family, num_hidden_layers=4)
    dataset = save_rows(greedy_rows(target_dir, rows=12, new_tokens=20), tmp_path / "data")
    target = load_target(target_dir)
    model_type = text_config(target.config).model_type
    prompts = torch.randint(0, 256, (3, 8), generator=torch.Generator().manual_seed(7))
    plain = [plain_generate(target, p[None], max_new_tokens=16).output_ids for p in prompts]
    for method in ("eagle3", "eagle1"):
        folder = _train(target_dir, dataset, tmp_path / method, method)
        config = json.loads((folder / "config.json").read_text())
        assert config["model_type"] == config["layer_config"]["model_type"] == "llama"
        assert config["target_model_type"] == model_type and config["layer_config"]["hidden_act"] == "silu"
        drafter = build_drafter(str(folder), target)
        layer = drafter.head.midlayer if method == "eagle3" else drafter.head.layers[0]
        assert type(layer).__name__ == "LlamaDecoderLayer"
        for prompt, reference in zip(prompts, plain):
            assert speculative_generate(target, drafter, prompt[None], max_new_tokens=16, k=3).output_ids == reference
        for fmt in FORMATS[method]:
            out = tmp_path / f"{method}-{fmt}"
            refusal = HOSTS[fmt].refusal(method, model_type, None)
            if refusal:
                with pytest.raises(DraftsmithError, match="cannot host") as err:
                    export_drafter(folder, fmt, out, target=target)
                assert HOSTS[fmt].engine in str(err.value) and "\n" not in str(err.value)
                assert not (out / "config.json").exists()
                continue
            report = export_drafter(folder, fmt, out, target=target, prompts=default_prompts(target, count=1), k=3,
                                    max_new_tokens=10)
            assert report.proposals_compared > 0 and report.mu_readback == report.mu_native, (family, method, fmt)


def test_hosting_refusals_name_engine_version_and_what_is_missing():
    from serve.export.hosts import check_hosted

    with pytest.raises(DraftsmithError, match=r"vLLM 0\.34\.0 cannot host a eagle3 drafter for a 'gemma3_text' "
                                              r"target: its Gemma3ForCausalLM does not implement SupportsEagle3.*"
                                              r"--format sglang"):
        check_hosted("eagle3", "gemma3", "vllm", "0.34.0")
    with pytest.raises(DraftsmithError, match="get_embed_and_head"):
        check_hosted("eagle1", "qwen2_moe", "sglang")
    with pytest.raises(DraftsmithError, match="has not read"):
        check_hosted("eagle3", "olmo2", "vllm")
    check_hosted("eagle1", "gemma3_text", "vllm")  # vLLM's EAGLE-1 needs nothing of the target class
    check_hosted("medusa", "gemma2", "vllm")
