"""Medusa-1 heads: separate weights everywhere, zero-initialized ResBlocks, lm_heads from the target's."""
from __future__ import annotations

import torch

from draftsmith.serve.drafters.folder import build_head, make_drafter
from draftsmith.serve.methods.medusa.head import medusa_config
from draftsmith.serve.core.layers import FINAL
from draftsmith.serve.core.target import load_target
from draftsmith.serve.tree import TreeSpec


def test_medusa_heads_share_no_parameters(tiny_target_dir):
    target = load_target(tiny_target_dir)
    heads = build_head(medusa_config(target, num_heads=3, num_layers=2))
    params = list(heads.parameters())
    assert len({p.data_ptr() for p in params}) == len(params) == 3 * 2 * 2 + 3
    state = heads.state_dict()
    assert {k for k in state if k.startswith("blocks.")} == {
        f"blocks.{h}.layers.{l}.{w}" for h in range(3) for l in range(2) for w in ("weight", "bias")}
    assert {k for k in state if k.startswith("lm_heads.")} == {f"lm_heads.{h}.weight" for h in range(3)}
    # training one head's layer leaves every other layer untouched
    heads.blocks[0].layers[0].weight.data.add_(1.0)
    assert float(heads.blocks[1].layers[0].weight.detach().abs().sum()) == 0.0
    assert float(heads.blocks[0].layers[1].weight.detach().abs().sum()) == 0.0


def test_medusa_init_is_identity_plus_target_lm_head(tiny_target_dir):
    target = load_target(tiny_target_dir)
    heads = build_head(medusa_config(target, num_heads=2))
    lm = target.model.get_output_embeddings().weight
    heads.init_from_target(lm)
    h = torch.randn(5, 32)
    logits = heads(h)  # (2, 5, V)
    assert torch.allclose(logits[1], h @ lm.T, atol=1e-5)  # zero-init ResBlocks are the identity
    reduced = build_head(medusa_config(target, num_heads=2, draft_vocab_size=10))
    keep = torch.arange(100, 110)
    t2d = torch.zeros(259, dtype=torch.bool)
    t2d[keep] = True
    reduced.init_from_target(lm, keep - torch.arange(10), t2d)
    assert torch.equal(reduced.lm_heads[0].weight, lm[keep])


def test_medusa_drafter_chain_and_static_tree(tiny_target_dir):
    target = load_target(tiny_target_dir)
    heads = build_head(medusa_config(target, num_heads=3))
    heads.init_from_target(target.model.get_output_embeddings().weight)
    torch.nn.init.normal_(heads.blocks[1].layers[0].weight, std=0.5)
    drafter = make_drafter(heads, target)
    ids = torch.arange(40, 50)
    out = target.model(ids[None], output_hidden_states=True)
    drafter.begin(ids, torch.cat([ids[1:], ids[:1]]), {FINAL: out.hidden_states[-1][0]})
    chain = drafter.propose(5)
    assert len(chain) == 3  # one token per head at most
    logits = heads(out.hidden_states[-1][0, -1])
    assert chain.tokens.tolist() == logits.argmax(-1).tolist()
    tree = drafter.propose(5, tree=TreeSpec(static_choices=((0,), (1,), (0, 0), (0, 1), (0, 0, 0), (0, 0, 0, 0))))
    assert tree.parents.tolist() == [-1, -1, 0, 0, 2]  # depth 4 dropped: only 3 heads
    top2 = torch.topk(logits, 2, dim=-1).indices
    assert tree.tokens.tolist() == [top2[0, 0], top2[0, 1], top2[1, 0], top2[1, 1], top2[2, 0]]
    dynamic = drafter.propose(5, tree=TreeSpec(depth=3, top_k=2, total_tokens=6))
    assert len(dynamic) == 6 and all(p < i for i, p in enumerate(dynamic.parents.tolist()))
