"""`evaluate` on the real default target: chat rendering, our decoder against transformers' prompt lookup."""
from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from draftsmith.eval.config import EvalConfig
from draftsmith.eval.evaluate import evaluate
from draftsmith.serve.core.target_config import TargetConfig


@pytest.mark.slow
def test_demo_target_ngram_against_prompt_lookup(demo_target_dir):
    config = EvalConfig(max_new_tokens=12, k=4, per_domain_limit=1, hf_plain=False, cost_model=False,
                        progress=False, bootstrap_samples=20, target=TargetConfig(threads=1))
    result = evaluate(str(demo_target_dir), {"ngram": "ngram"}, ["builtin:edit"], config)
    assert result["target"]["chat_template"] and result["settings"]["domains"] == {"edit": 1}
    tokenizer = AutoTokenizer.from_pretrained(demo_target_dir)
    assert tokenizer.decode(result["records"][0]["prompt_token_ids"]).endswith("<|im_start|>assistant\n")
    audit = result["exactness"].pop("audit")
    assert result["exactness"] == {"identical": 1, "total": 1, "checked": True, "temperature": 0.0,
                                   "against": "plain greedy decoding",
                                   "by_drafter": {"ngram": {"identical": 1, "total": 1}}}
    assert audit["rounding_flips"] == audit["unexplained"] == 0 and audit["divergences"] == []
    lookup = result["peers"]["hf_prompt_lookup"]
    assert lookup["exactness"] == {"identical": 1, "total": 1} and lookup["mu"] >= 1.0
    assert result["overall"]["ngram"]["mu"] > 1.0  # an edit prompt repeats its input: lookup must hit
