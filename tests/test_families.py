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

    with pytest.raises(DraftsmithError, match=r"vLLM 0\.34\.0 cannot host an eagle3 drafter for a 'gemma3_text' "
                                              r"target: its Gemma3ForCausalLM does not implement SupportsEagle3.*"
                                              r"--format sglang"):
        check_hosted("eagle3", "gemma3", "vllm", "0.34.0")
    with pytest.raises(DraftsmithError, match="get_embed_and_head"):
        check_hosted("eagle1", "qwen2_moe", "sglang")
    with pytest.raises(DraftsmithError, match="has not read"):
        check_hosted("eagle3", "olmo2", "vllm")
    check_hosted("eagle1", "gemma3_text", "vllm")  # vLLM's EAGLE-1 needs nothing of the target class
    check_hosted(None, "gemma2", "vllm")  # Medusa's form needs nothing of the target class (hosted_as None)
