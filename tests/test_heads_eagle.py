"""EAGLE-1 / EAGLE-3 heads: native tensor names, the target family's own decoder layer, and the drafting
runtime (KV rollback, chains, sampled chains, dynamic and static trees)."""
from __future__ import annotations

import pytest
import torch

from draftsmith.serve.drafters.folder import build_head, make_drafter
from draftsmith.serve.core.layers import FINAL
from draftsmith.serve.core.target import load_target
from draftsmith.serve.tree import TreeSpec


def _features(target, ids):
    out = target.model(ids[None], output_hidden_states=True)
    hs = {i: out.hidden_states[i + 1][0] for i in range(target.num_layers)}
    hs[FINAL] = out.hidden_states[-1][0]
    return hs


def _configs(target):
    from draftsmith.serve.methods.eagle1.head import eagle1_config
    from draftsmith.serve.methods.eagle3.head import eagle3_config

    return [eagle1_config(target), eagle3_config(target, aux_layer_ids=[0, 1, 1])]


def test_eagle1_tensor_names_and_shapes(tiny_target_dir):
    target = load_target(tiny_target_dir)
    cfg = _configs(target)[0]
    state = build_head(cfg).state_dict()
    assert state["fc.weight"].shape == (32, 64) and "fc.bias" not in state
    assert all(k == "fc.weight" or k.startswith("layers.0.") for k in state)
    assert not any("input_layernorm" in k for k in state)  # identity, not stored (vLLM's EAGLE-1)
    assert not any("embed" in k or "lm_head" in k for k in state)  # the target's, read at load
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    assert isinstance(build_head(cfg).layers[0], LlamaDecoderLayer)
    assert cfg.input_layernorm is False and cfg.aux_layer_ids == [FINAL]


def test_eagle3_tensor_names_and_shapes(tiny_target_dir):
    from draftsmith.serve.methods.eagle3.head import eagle3_config
    from draftsmith.serve.core.layers import default_eagle3_layers

    target = load_target(tiny_target_dir)
    cfg = eagle3_config(target, draft_vocab_size=100, aux_layer_ids=[0, 1, 1])
    state = build_head(cfg).state_dict()
    assert state["fc.weight"].shape == (32, 96)
    assert state["midlayer.self_attn.q_proj.weight"].shape[1] == 64  # q/k/v read cat(embed, hidden): 2h
    assert state["midlayer.self_attn.k_proj.weight"].shape[1] == 64
    assert state["midlayer.hidden_norm.weight"].shape == (32,) and state["norm.weight"].shape == (32,)
    assert state["lm_head.weight"].shape == (100, 32)
    assert state["d2t"].dtype == torch.long and state["d2t"].shape == (100,)
    assert state["t2d"].dtype == torch.bool and state["t2d"].shape == (259,)
    assert not any("embed" in k for k in state)
    assert default_eagle3_layers(30) == [1, 14, 26]
    with pytest.raises(Exception, match="outside 0..1"):
        eagle3_config(target, aux_layer_ids=[0, 5, 1])


def test_eagle3_norm_output_feeds_the_normed_state_forward_with_the_same_logits(tiny_target_dir):
    """EAGLE-3.1's norm_output: the same weights give the same first-step logits, and the state the next step reads
    is norm(out) instead of out."""
    import dataclasses

    from draftsmith.serve.drafters.masks import additive, causal_allowed
    from draftsmith.serve.methods.eagle3.head import eagle3_config

    target = load_target(tiny_target_dir)
    cfg = eagle3_config(target, draft_vocab_size=100, aux_layer_ids=[0, 1, 1])
    plain = build_head(cfg).eval()
    normed = build_head(dataclasses.replace(cfg, norm_output=True)).eval()
    normed.load_state_dict(plain.state_dict())  # no tensor of its own
    ids = torch.randint(0, 259, (6,), generator=torch.Generator().manual_seed(0))
    hidden = plain.input_hidden(_features(target, ids))[None]  # (1, T, h)
    embeds = target.model.get_input_embeddings()(ids)[None]
    kwargs = dict(position_ids=torch.arange(6)[None], attention_mask=additive(causal_allowed(6, 0), torch.float32)[None])
    with torch.no_grad():
        out, out_normed = plain(hidden, embeds, **kwargs), normed(hidden, embeds, **kwargs)
        assert torch.allclose(out_normed, plain.norm(out)) and not torch.allclose(out_normed, out)
        assert torch.allclose(normed.logits(out_normed), plain.logits(out))


def test_heads_build_and_draft_for_every_family(tiny_target_factory, family):
    target = load_target(tiny_target_factory(family))
    ids = torch.randint(0, 256, (14,), generator=torch.Generator().manual_seed(1))
    hs = _features(target, ids)
    for cfg in _configs(target):
        torch.manual_seed(0)
        drafter = make_drafter(build_head(cfg), target)
        drafter.begin(ids[:8], ids[1:9], {k: v[:8] for k, v in hs.items()})
        chain = drafter.propose(4)
        assert len(chain) == 4 and chain.q is None and not chain.is_tree


def test_commit_rolls_back_the_draft_cache(tiny_target_dir):
    """After propose + commit the drafter is exactly where a fresh begin on the longer prefix puts it."""
    target = load_target(tiny_target_dir)
    ids = torch.randint(0, 256, (14,), generator=torch.Generator().manual_seed(2))
    hs = _features(target, ids)
    for cfg in _configs(target):
        torch.manual_seed(0)
        head = build_head(cfg)
        a, b = make_drafter(head, target), make_drafter(head, target)
        a.begin(ids[:8], ids[1:9], {k: v[:8] for k, v in hs.items()})
        a.propose(4)
        a.propose(3, tree=TreeSpec(depth=3, top_k=2, total_tokens=5))
        a.commit(ids[9:12], {k: v[8:11] for k, v in hs.items()})
        b.begin(ids[:11], ids[1:12], {k: v[:11] for k, v in hs.items()})
        assert a.cache.get_seq_length() == b.cache.get_seq_length() == 11
        assert torch.allclose(a._logits, b._logits, atol=1e-5)
        assert a.propose(4).tokens.tolist() == b.propose(4).tokens.tolist()


def test_sampled_chain_returns_q_over_the_full_vocabulary(tiny_target_dir):
    from draftsmith.serve.methods.eagle3.head import eagle3_config

    target = load_target(tiny_target_dir)
    ids = torch.arange(10, 22)
    hs = _features(target, ids)
    head = build_head(eagle3_config(target, draft_vocab_size=50, aux_layer_ids=[0, 1, 1]))
    keep = torch.arange(0, 259, 5)[:50]  # a reduced vocabulary: every 5th id
    t2d = torch.zeros(259, dtype=torch.bool)
    t2d[keep] = True
    head.set_vocab(keep - torch.arange(50), t2d)
    drafter = make_drafter(head, target)
    drafter.begin(ids[:8], ids[1:9], {k: v[:8] for k, v in hs.items()})
    draft = drafter.propose(3, temperature=0.8, generator=torch.Generator().manual_seed(0))
    assert draft.q.shape == (3, 259)
    assert torch.allclose(draft.q.sum(-1), torch.ones(3), atol=1e-5)
    assert float(draft.q[:, ~t2d].abs().sum()) == 0.0  # zeros outside the draft vocabulary
    assert all(t2d[t] for t in draft.tokens.tolist()) and all(draft.q[i, t] > 0 for i, t in enumerate(draft.tokens.tolist()))


def test_dynamic_and_static_trees(tiny_target_dir):
    target = load_target(tiny_target_dir)
    ids = torch.arange(30, 42)
    hs = _features(target, ids)
    for cfg in _configs(target):
        drafter = make_drafter(build_head(cfg), target)
        drafter.begin(ids[:8], ids[1:9], {k: v[:8] for k, v in hs.items()})
        tree = drafter.propose(5, tree=TreeSpec(depth=4, top_k=3, total_tokens=10))
        parents = tree.parents.tolist()
        assert len(tree) == 10 and tree.q is None
        assert all(p < i for i, p in enumerate(parents))  # topological
        chain = drafter.propose(4)
        assert tree.tokens[0] == chain.tokens[0] and parents[0] == -1  # best child first = greedy token
        static = drafter.propose(5, tree=TreeSpec(static_choices=((0,), (1,), (0, 0), (0, 1), (0, 0, 0))))
        assert static.parents.tolist() == [-1, -1, 0, 0, 2]
        assert static.tokens[[0, 2, 4]].tolist() == chain.tokens[:3].tolist()  # the rank-0 path is the chain


def test_grow_tree_pure():
    from draftsmith.serve.drafters.heads_common import grow_tree

    root = torch.log_softmax(torch.tensor([0.0, 3.0, 2.0, -1.0]), -1)
    child = torch.log_softmax(torch.tensor([5.0, 0.0, 0.0, 0.0]), -1)
    tokens, parents = grow_tree(root, lambda nodes, depth, *_: child.expand(len(nodes), -1),
                                TreeSpec(depth=2, top_k=2, total_tokens=3), max_depth=8)
    # root children 1 (best) and 2; each child's best continuation is token 0 (p ~ 0.98)
    assert tokens.tolist() == [1, 2, 0] and parents.tolist() == [-1, -1, 0]


def test_min_confidence_shortens_chains_and_stays_exact(tiny_target_dir, tmp_path):
    """Chains stop where the draft's top-1 probability is below min_confidence; the output stays identical to
    plain greedy decoding for every threshold, and a folder spec `DIR:min_confidence=x` sets it."""
    from draftsmith.serve.decoding import plain_generate, speculative_generate
    from draftsmith.serve.drafters import DrafterSpecError, build_drafter
    from draftsmith.serve.drafters.folder import save_drafter
    from draftsmith.serve.methods.medusa.head import medusa_config
    from draftsmith.serve.core.errors import DraftsmithError

    target = load_target(tiny_target_dir)
    ids = torch.randint(0, 256, (1, 10), generator=torch.Generator().manual_seed(3))
    plain = plain_generate(target, ids, max_new_tokens=16).output_ids
    for cfg in [*_configs(target), medusa_config(target, num_heads=3)]:
        torch.manual_seed(0)
        head = build_head(cfg)
        top = {}
        for threshold in (0.0, 0.5, 0.999):
            drafter = make_drafter(head, target, min_confidence=threshold)
            res = speculative_generate(target, drafter, ids, max_new_tokens=16, k=3)
            assert res.output_ids == plain, (cfg.method, threshold)
            top[threshold] = max(res.stats.drafted_per_cycle)
        assert top[0.0] == 3 and top[0.999] == 0  # an untrained head is never 99.9% sure
        folder = save_drafter(head, cfg, tmp_path / cfg.method)
        assert build_drafter(f"{folder}:min_confidence=0.25", target).min_confidence == 0.25
        with pytest.raises(DraftsmithError, match="unknown drafter folder option"):
            build_drafter(f"{folder}:width=2", target)
        with pytest.raises(DraftsmithError, match=r"min_confidence must be in \[0, 1\)"):
            build_drafter(f"{folder}:min_confidence=1.5", target)
        with pytest.raises(DrafterSpecError, match="bad drafter option"):
            build_drafter(f"{folder}:min_confidence=high", target)
