"""Targets that ship multi-token-prediction layers (DeepSeek-V3, DeepSeek-V3.2, GLM-4.5 MoE, ERNIE-4.5 MoE,
MiMo-V2-Flash), as base models: they load, speculative decoding gives plain greedy decoding's tokens at batch 1 and in
the batched decoder's slot cache (latent attention's cached latent and RoPE key, V3.2's lightning-indexer keys past
its top-k, MiMo's keys wider than its values, its sliding layers past their window), and the cache each token takes
is what the batched decoder's memory check counts. EAGLE heads train, decode and export on them in
tests/test_families.py."""
from __future__ import annotations

import pytest
import torch

from draftsmith.serve.batch.decoder import BatchDecoder, Job
from draftsmith.serve.core.errors import TargetError
from draftsmith.serve.core.families import family_of
from draftsmith.serve.core.target import SUPPORTED_MODEL_TYPES, load_target
from draftsmith.serve.decoding import plain_generate, speculative_generate
from draftsmith.serve.drafters import build_drafter
from tests.tiny_models import MTP_FAMILIES, save_tiny_target, tiny_config, tiny_model

NEW_TOKENS = 20


@pytest.fixture(scope="module")
def mtp_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("mtp")
    return {family: save_tiny_target(root / family, family) for family in MTP_FAMILIES}


def repeating_prompts() -> list[list[int]]:
    """Five prompts of mixed lengths (9-24 tokens) that repeat a random span three times, so that the n-gram drafter
    finds drafts in them; with 20 new tokens MiMo's sliding layers (window 16) run past their window."""
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(0, 256, (n,), generator=gen).repeat(3).tolist() for n in (3, 5, 8, 4, 6)]


@pytest.mark.parametrize("family", MTP_FAMILIES)
def test_each_family_is_a_row_that_loads(mtp_dirs, family):
    target = load_target(mtp_dirs[family])
    row = family_of(target.config.model_type)
    assert row is not None and row.loads and row.tiny == family and target.config.model_type in SUPPORTED_MODEL_TYPES
    assert not row.recurrent and not row.planned
    # the MTP-layer count the real checkpoints carry (the base model ignores it); transformers' MiMo config has none
    # and drops the checkpoint's `model.mtp.*` weights on load
    assert getattr(target.config, "num_nextn_predict_layers", 1) == 1


@pytest.mark.parametrize("family", MTP_FAMILIES)
def test_ngram_drafts_give_plain_greedy_tokens_at_batch_1(mtp_dirs, family):
    target = load_target(mtp_dirs[family])
    drafted = 0
    for prompt in repeating_prompts():
        plain = plain_generate(target, torch.tensor([prompt]), max_new_tokens=NEW_TOKENS)
        spec = speculative_generate(target, build_drafter("ngram:length=fixed", target), torch.tensor([prompt]),
                                    max_new_tokens=NEW_TOKENS, k=4)
        assert spec.output_ids == plain.output_ids
        drafted += sum(spec.stats.drafted_per_cycle)
    assert drafted > 0  # drafts were verified and rolled back, or the test proves little


@pytest.mark.parametrize("family", MTP_FAMILIES)
def test_batched_rows_equal_plain_greedy_decoding(mtp_dirs, family):
    """Four slots, five requests (the fifth takes a freed slot): no drafts, n-gram drafts, and a random EAGLE-3
    head's drafts (every cycle, mostly rejected: each row's cache columns are overwritten at its own accepted
    count); every row's tokens are its plain decoding's."""
    from draftsmith.serve.drafters.folder import build_head, make_drafter
    from draftsmith.serve.methods.eagle3.head import eagle3_config

    target = load_target(mtp_dirs[family])
    prompts = repeating_prompts()
    plain = [plain_generate(target, torch.tensor([p]), max_new_tokens=NEW_TOKENS).output_ids for p in prompts]
    torch.manual_seed(5)
    head = make_drafter(build_head(eagle3_config(target, aux_layer_ids=[0, 1, 1])), target, check=False)
    for drafter in (None, build_drafter("ngram:length=fixed", target), head):
        decoder = BatchDecoder(target, drafter, slots=4, k=3)
        for i, prompt in enumerate(prompts):
            decoder.add(Job(i, prompt, max_new_tokens=NEW_TOKENS))
        done = decoder.run()
        assert [f.result.output_ids for f in done] == plain
    assert sum(sum(f.result.stats.drafted_per_cycle) for f in done) > 0


@pytest.mark.parametrize("family", MTP_FAMILIES)
def test_the_cache_a_token_takes_is_what_the_memory_check_counts(family):
    """kv_bytes_per_token (the batched decoder's check that a batch fits) against transformers' own cache after a
    forward within MiMo's window: DeepSeek's latent attention caches one latent (kv_lora_rank) and one RoPE key per
    token in place of keys and values, MiMo's sliding layers twice the key/value heads with narrower values."""
    from transformers import DynamicCache

    from draftsmith.serve.core.kv import cache_kwargs
    from draftsmith.serve.core.slots import kv_bytes_per_token

    model, tokens = tiny_model(family), 12
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(torch.arange(tokens)[None], **cache_kwargs(model, cache))
    held = [[layer.keys, layer.values, *([layer.indexer_keys[:, None]] if hasattr(layer, "indexer_keys") else [])]
            for layer in cache.layers]  # DeepSeek-V3.2's lightning indexer keeps a key of its own per token
    stored = sum(t.numel() * t.element_size() for tensors in held for t in tensors)
    counted = kv_bytes_per_token(model.config, torch.float32)
    # every layer's own width is at most the widest one's, which the check counts for each
    assert stored <= counted * tokens and max(sum(t.shape[1] * t.shape[3] for t in tensors)
                                              for tensors in held) * 4 * 2 == counted


@pytest.mark.parametrize("family", MTP_FAMILIES)
def test_the_memory_plan_refuses_them_in_one_line(family):
    from draftsmith.serve.core.target_arch import arch_of

    with pytest.raises(TargetError, match="does not model") as refused:
        arch_of(tiny_config(family))
    assert "\n" not in str(refused.value)


def test_hosting_is_what_the_engines_classes_have():
    """Read from vLLM 0.33.0/0.34.0 and SGLang 0.5.23 (serve/core/families.py): vLLM's DeepSeek-V3, V3.2 and
    MiMo-V2-Flash classes capture aux hidden states, its GLM-4.5 and ERNIE-4.5 MoE classes do not; SGLang's ERNIE-4.5
    and MiMo classes share embeddings but capture none."""
    from draftsmith.serve.export.hosts import HOSTS

    vllm, sglang = HOSTS["vllm"], HOSTS["sglang"]
    families = ("deepseek_v3", "deepseek_v32", "glm4_moe", "ernie4_5_moe", "mimo_v2_flash")
    assert [vllm.refusal("EAGLE-3", f, None) is None for f in families] == [True, True, False, False, True]
    assert [sglang.refusal("EAGLE-3", f, None) is None for f in families] == [True, True, True, False, False]
    assert all(sglang.refusal("EAGLE-1", f, None) is None and vllm.refusal("EAGLE-1", f, None) is None
               for f in families)
    assert "set_eagle3_layers_to_capture" in sglang.refusal("EAGLE-3", "ernie4_5_moe", None)
    assert "SupportsEagle3" in vllm.refusal("EAGLE-3", "glm4_moe", None)


def test_deepseek_v4_is_refused_in_one_line(tmp_path, capsys):
    """DeepSeek-V4 (its checkpoints ship an MTP layer too) is a row draftsmith does not load (serve/core/families.py
    says why): loading it, from the library or the command line, stops in one line naming why and how to serve its
    own MTP layer instead, before its weights are read."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from draftsmith.serve.core.target_arch import arch_of
    from tests.cli_fixtures import cli_error
    from tests.tiny_models import tiny_tokenizer

    config = AutoConfig.for_model(
        "deepseek_v4", vocab_size=259, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, head_dim=16,
        q_lora_rank=16, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, hc_mult=2,
        sliding_window=8, o_groups=2, o_lora_rank=8, index_n_heads=2, index_head_dim=8, index_topk=2,
        num_nextn_predict_layers=1, eos_token_id=258, pad_token_id=256, bos_token_id=None)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "v4")
    tiny_tokenizer().save_pretrained(tmp_path / "v4")
    assert family_of("deepseek_v4") is not None and not family_of("deepseek_v4").loads
    with pytest.raises(TargetError) as refused:
        load_target(tmp_path / "v4")
    line = str(refused.value)
    assert "does not load" in line and "cannot be rolled back" in line and '"method": "mtp"' in line
    assert "\n" not in line
    assert cli_error(capsys, "generate", "--target", tmp_path / "v4", "--prompt", "ab") == f"error: {line}"
    with pytest.raises(TargetError, match="does not load"):  # nor is a memory plan made for it (`train --plan`)
        arch_of(config)
