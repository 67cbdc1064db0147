"""Every family users fine-tune: EAGLE-3 and EAGLE-1 heads train on a tiny target of the family, draft with output
identical to plain greedy decoding, are built on the Llama layer the engines serve, and export in every format whose
engine can host the family (read back with μ equal to the native drafter's); where an engine cannot host it, the
export stops with one line naming the engine and what its target class lacks, and writes nothing."""
from __future__ import annotations

import json

import pytest

from draftsmith.support_matrix import FAMILIES, check_family, formats_of, matrix_markdown, matrix_methods
from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.export.hosts import HOSTS


@pytest.mark.parametrize("family", FAMILIES)
def test_family_trains_drafts_exactly_and_exports(family, tmp_path):
    result = check_family(family, tmp_path)
    from draftsmith.serve.methods.registry import method as method_of

    for method in matrix_methods():
        config = json.loads((tmp_path / method / "drafter" / "config.json").read_text())
        assert config["model_type"] == config["layer_config"]["model_type"] == "llama"
        assert config["target_model_type"] == result.model_type and config["layer_config"]["hidden_act"] == "silu"
        assert result.exact[method] == (3, 3), (family, method)
        for fmt in formats_of(method):
            verdict = result.exports[method][fmt]
            refusal = HOSTS[fmt].refusal(method_of(method).exports[fmt].hosted_as, result.model_type, None)
            if refusal:  # one line naming the engine and what its target class lacks; nothing written
                assert verdict.startswith("refused: ") and refusal in verdict and "\n" not in verdict
                assert not (tmp_path / f"{method}-{fmt}" / "config.json").exists()
            else:
                assert verdict == "ok", (family, method, fmt, verdict)
                native, back = result.mu[method][fmt]
                assert native == back
    row = matrix_markdown([result]).splitlines()[-1]
    assert row.startswith(f"| {family} ({result.model_type}) | ✓") and "6/6 identical" in row


def test_hosting_refusals_name_engine_version_and_what_is_missing():
    from draftsmith.serve.export.hosts import check_hosted

    with pytest.raises(DraftsmithError, match=r"vLLM 0\.34\.0 cannot host an EAGLE-3 drafter for a 'gemma3_text' "
                                              r"target: its Gemma3ForCausalLM does not implement SupportsEagle3.*"
                                              r"draftsmith serve"):
        check_hosted("EAGLE-3", "gemma3", "vllm", "0.34.0")
    with pytest.raises(DraftsmithError, match=r"SGLang 0\.5\.23 cannot host an EAGLE-3 drafter for a 'gemma3_text' "
                                              r"target: its Gemma3ForCausalLM captures the EAGLE-3 states before the "
                                              r"residual add.*draftsmith serve"):
        check_hosted("EAGLE-3", "gemma3_text", "sglang", "0.5.23")
    with pytest.raises(DraftsmithError, match="get_embed_and_head"):
        check_hosted("EAGLE-1", "qwen2_moe", "sglang")
    with pytest.raises(DraftsmithError, match="has not read"):
        check_hosted("EAGLE-3", "olmo2", "vllm")
    check_hosted("EAGLE-1", "gemma3_text", "vllm")  # vLLM's EAGLE-1 needs nothing of the target class
    check_hosted(None, "gemma2", "vllm")  # Medusa's form needs nothing of the target class (hosted_as None)


def test_sglang_refuses_an_untied_gemma3_target(tmp_path):
    """SGLang 0.5.23's Gemma3ForCausalLM never loads an untied lm_head (the EAGLE-1 draft would get an unloaded
    one): the export stops in one line, writes nothing, and points at vLLM, whose class ties only as the config says;
    a tied target (Google's checkpoints, the tiny one) exports."""
    from draftsmith.serve.core.target import load_target
    from draftsmith.serve.export import export_drafter
    from draftsmith.serve.export.hosts import check_hosted
    from tests.export_fixtures import make_native
    from tests.tiny_models import save_tiny_target

    check_hosted("EAGLE-1", "gemma3_text", "sglang", tied=True)
    check_hosted("EAGLE-1", "gemma3_text", "sglang")  # not known before the target is loaded
    check_hosted("EAGLE-1", "llama", "sglang", tied=False)
    target = load_target(str(save_tiny_target(tmp_path / "target", "gemma", tie_word_embeddings=False)))
    native = make_native(target, "eagle1", tmp_path / "native")
    with pytest.raises(DraftsmithError) as err:
        export_drafter(native, "sglang", tmp_path / "out", target=target)
    assert str(err.value).startswith("--format sglang: SGLang (read in 0.5.23) cannot serve a 'gemma3_text' target "
                                     "whose lm_head is untied: its Gemma3ForCausalLM never loads an untied "
                                     "lm_head.weight")
    assert str(err.value).endswith("Export --format vllm instead.") and "\n" not in str(err.value)
    assert not (tmp_path / "out").exists()


def test_a_family_is_a_row():
    """The family table (serve/core/families.py) names every tiny test target with its model_type, and is what
    target loading, the memory plan and the hosting check read."""
    from draftsmith.serve.core.families import FAMILIES as ROWS, family_of, text_family, tiny_families
    from draftsmith.serve.core.target import SUPPORTED_MODEL_TYPES
    from draftsmith.serve.core.target_arch import arch_of
    from tests.tiny_models import FAMILIES as TINY, tiny_config

    assert set(tiny_families()) == set(TINY) and tiny_families() == FAMILIES
    for row in ROWS:
        if row.tiny:
            config = tiny_config(row.tiny)
            assert text_family(config.model_type) == row.model_type, row
            if row.planned:  # arch_of refuses the others in one line (tests/test_hybrid_targets.py)
                assert arch_of(config).qk_norm == row.qk_norm
        assert (row.model_type in SUPPORTED_MODEL_TYPES) == row.loads
        assert all(family_of(alias) is row for alias in row.aliases)
    assert text_family("gemma3") == "gemma3_text" and family_of("mamba") is None
    assert HOSTS["vllm"].refusal("EAGLE-3", "gemma2", None).endswith("its Gemma2ForCausalLM does not implement "
                                                                     "SupportsEagle3 (no aux hidden-state capture)")
