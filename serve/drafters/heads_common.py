"""What the trained heads (EAGLE-1, EAGLE-3, Medusa) share: their config, the target family's HF building
blocks, attention masks over a draft KV cache, and draft-vocabulary mapping.

The heads are built from the target's own HF decoder-layer class (found by model_type, never forked), so
every supported family works; anything family-specific stays inside transformers.
"""
from __future__ import annotations

import dataclasses
import importlib
import inspect
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from torch import nn

from serve.errors import DraftsmithError
from serve.layers import CONVENTION

FORMAT_KEY = "draftsmith_drafter"  # the config.json key that marks a native drafter folder (value: format version)
FORMAT_VERSION = 1
METHODS = ("eagle1", "eagle3", "medusa")


@dataclass
class HeadConfig:
    """Everything needed to rebuild a head without its target; saved as the drafter folder's config.json."""
    method: str
    model_type: str
    hidden_size: int
    vocab_size: int                      # the target's vocabulary
    draft_vocab_size: int                # == vocab_size when no reduced vocabulary is used
    num_speculative_tokens: int = 5      # K the head was trained for (Medusa: number of heads)
    aux_layer_ids: list[int] = field(default_factory=list)  # target layers the head reads (our convention)
    layer_convention: str = CONVENTION
    input_layernorm: bool = True         # EAGLE-1: False = the decoder layer's input norm is an identity
    hidden_norm: bool = True             # EAGLE-3: the fused hidden state is normed before attention
    fc_bias: bool = False                # EAGLE-1 fc bias
    medusa_num_layers: int = 1           # ResBlocks per Medusa head
    ttt_steps: int = 1                   # EAGLE-3 training-time-test unroll it was trained with
    # How it drafts unless told otherwise (serve/drafters/settings.py): K above, these two, a flag overrides.
    tree: Optional[dict] = None          # null = chains; {depth, top_k, total_tokens} or {static_choices} = trees
    min_confidence: float = 0.0          # chains stop where the draft's top-1 probability falls below it
    layer_config: dict = field(default_factory=dict)  # HF config of the drafter's decoder layer
    target_name: str = ""
    target_config_hash: str = ""
    target_tokenizer_hash: str = ""
    draftsmith_drafter: int = FORMAT_VERSION

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "HeadConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise DraftsmithError(f"drafter config has unknown fields {unknown}; written by a newer draftsmith?")
        return cls(**data)

    @property
    def uses_draft_vocab(self) -> bool:
        return self.draft_vocab_size != self.vocab_size


def text_config_of(model_config: Any) -> Any:
    return getattr(model_config, "text_config", None) or model_config


def drafter_layer_config(target_config: Any, *, attn_implementation: str = "sdpa") -> dict:
    """The target's text config as a dict, reduced to one full-attention layer: the drafter layer's config."""
    cfg = text_config_of(target_config).to_dict()
    cfg["num_hidden_layers"] = 1
    if "layer_types" in cfg:
        cfg["layer_types"] = ["full_attention"]  # a drafter layer sees its whole (short) cache
    for key in ("use_cache", "output_hidden_states", "torch_dtype", "dtype", "architectures", "_name_or_path",
                "quantization_config", "auto_map"):
        cfg.pop(key, None)
    cfg["_attn_implementation"] = attn_implementation
    return cfg


def hf_config(layer_config: dict) -> Any:
    from transformers import AutoConfig

    cfg = dict(layer_config)
    model_type = cfg.pop("model_type")
    attn = cfg.pop("_attn_implementation", "sdpa")
    config = AutoConfig.for_model(model_type, **cfg)
    config._attn_implementation = attn
    return config


def _family_module(model_type: str):
    family = model_type[: -len("_text")] if model_type.endswith("_text") else model_type
    try:
        return importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    except ModuleNotFoundError:
        raise DraftsmithError(f"transformers has no modeling module for model_type {model_type!r}") from None


def decoder_layer_class(model_type: str) -> type[nn.Module]:
    """The HF decoder-layer class of a family (e.g. LlamaDecoderLayer for 'llama')."""
    module = _family_module(model_type)
    found = [obj for name, obj in vars(module).items()
             if name.endswith("DecoderLayer") and inspect.isclass(obj) and obj.__module__ == module.__name__]
    if len(found) != 1:
        raise DraftsmithError(f"cannot pick the decoder layer of model_type {model_type!r} "
                              f"(found {[c.__name__ for c in found]})")
    return found[0]


def rotary_class(model_type: str) -> type[nn.Module]:
    module = _family_module(model_type)
    found = [obj for name, obj in vars(module).items()
             if name.endswith("RotaryEmbedding") and inspect.isclass(obj) and obj.__module__ == module.__name__]
    if not found:
        raise DraftsmithError(f"model_type {model_type!r} has no rotary embedding class")
    return found[0]


class Rope(nn.Module):
    """The family's rotary embedding (no stored weights): position_ids -> (cos, sin)."""

    def __init__(self, config: Any):
        super().__init__()
        self.inner = rotary_class(config.model_type)(config=config)
        params = inspect.signature(self.inner.forward).parameters
        # Gemma-3 keeps separate RoPE tables per layer type; the drafter layer is full attention.
        self.layer_type = "full_attention" if "layer_type" in params else None

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.layer_type is not None:
            return self.inner(x, position_ids, self.layer_type)
        return self.inner(x, position_ids)


def norm_like(layer: nn.Module, hidden_size: int, eps: float) -> nn.Module:
    """A fresh norm of the same class as the layer's input norm (RMSNorm flavours differ by family)."""
    source = getattr(layer, "input_layernorm", None) or getattr(layer, "post_attention_layernorm")
    return type(source)(hidden_size, eps=eps)


def rms_eps(config: Any) -> float:
    return float(getattr(config, "rms_norm_eps", None) or getattr(config, "layer_norm_eps", 1e-6))


# --------------------------------------------------------------------------------------------- masks

def additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """bool mask (True = may attend) -> additive float mask (0 / most negative), (.., Q, K) -> (.., 1, Q, K)."""
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask.unsqueeze(-3)


def causal_allowed(q_len: int, past: int, *, device=None) -> torch.Tensor:
    """(q_len, past + q_len) bool: query i sits at position past + i and sees keys 0..past + i."""
    keys = torch.arange(past + q_len, device=device)
    queries = torch.arange(q_len, device=device) + past
    return keys[None, :] <= queries[:, None]


def ttt_allowed(seq_len: int, step: int, *, device=None) -> torch.Tensor:
    """(T, (step+1)*T) bool for training-time test step `step` (0-based).

    Keys are [step-0 keys (T) | step-1 keys (T) | ... | step keys (T)]. Row p sees the real context
    causally (step-0 keys 0..p) and, from each later step, only its own column p: the draft tokens
    it produced itself, exactly what it sees at inference time.
    """
    blocks = [causal_allowed(seq_len, 0, device=device)]
    eye = torch.eye(seq_len, dtype=torch.bool, device=device)
    blocks += [eye] * step
    return torch.cat(blocks, dim=1)


# ------------------------------------------------------------------------------------ draft vocabulary

def identity_vocab(vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """d2t offsets (all zero) and t2d (all True) for a draft vocabulary equal to the target's."""
    return torch.zeros(vocab_size, dtype=torch.long), torch.ones(vocab_size, dtype=torch.bool)


def draft_token_ids(d2t: torch.Tensor) -> torch.Tensor:
    """(Vd,) target ids of the draft vocabulary: target_id = draft_id + d2t[draft_id]."""
    return torch.arange(d2t.numel(), device=d2t.device) + d2t


def check_vocab_maps(d2t: torch.Tensor, t2d: torch.Tensor, vocab_size: int) -> None:
    ids = draft_token_ids(d2t)
    if t2d.numel() != vocab_size or t2d.dtype != torch.bool:
        raise DraftsmithError(f"t2d must be a bool tensor of the target vocabulary size {vocab_size}, "
                              f"got {tuple(t2d.shape)} {t2d.dtype}")
    if ids.min() < 0 or ids.max() >= vocab_size or int(t2d.sum()) != d2t.numel() or not bool(t2d[ids].all()):
        raise DraftsmithError("d2t and t2d disagree: every draft id must map to a target id marked in t2d")
    if bool((ids[1:] <= ids[:-1]).any()):
        raise DraftsmithError("d2t must map draft ids to strictly increasing target ids")


def full_vocab_probs(probs: torch.Tensor, d2t: torch.Tensor | None, vocab_size: int) -> torch.Tensor:
    """(.., Vd) probabilities over the draft vocabulary -> (.., V) over the target's, zeros elsewhere."""
    if d2t is None or probs.shape[-1] == vocab_size:
        return probs
    out = probs.new_zeros(*probs.shape[:-1], vocab_size)
    out[..., draft_token_ids(d2t)] = probs
    return out


# ------------------------------------------------------------------------------------------- identity

def check_target_identity(config: HeadConfig, target) -> None:
    """A drafter serves only the target it was trained for: same tokenizer (ids) and same architecture."""
    problems = []
    if config.target_tokenizer_hash and config.target_tokenizer_hash != target.tokenizer_hash:
        problems.append(f"tokenizer hash {target.tokenizer_hash} != {config.target_tokenizer_hash} (token ids "
                        f"would mean different text)")
    if config.target_config_hash and config.target_config_hash != target.config_hash:
        problems.append(f"config hash {target.config_hash} != {config.target_config_hash} (a different model "
                        f"architecture)")
    if problems:
        raise DraftsmithError(f"this {config.method} drafter was trained for target {config.target_name!r} "
                              f"(tokenizer {config.target_tokenizer_hash}, config {config.target_config_hash}) but "
                              f"is being used with {target.name!r}: " + "; ".join(problems)
                              + ". Train a drafter for this target (draftsmith train).")
    text = text_config_of(target.config)
    if text.hidden_size != config.hidden_size or text.vocab_size != config.vocab_size:
        raise DraftsmithError(f"drafter expects hidden size {config.hidden_size} and vocabulary {config.vocab_size}; "
                              f"target {target.name!r} has {text.hidden_size} and {text.vocab_size}")


# -------------------------------------------------------------------------------------------- drafting

def confident(logits: torch.Tensor, min_confidence: float) -> bool:
    """Whether a chain keeps drafting: the draft's top-1 probability (at temperature 1) is >= min_confidence.

    Stopping a chain early never changes the output distribution (each position is still verified exactly);
    it saves the verify cost of drafts that would likely be rejected: the lever when acceptance is low."""
    return min_confidence <= 0 or float(torch.softmax(logits.float(), dim=-1).max()) >= min_confidence


def sample_chain_token(logits: torch.Tensor, *, temperature: float, generator: torch.Generator | None,
                       d2t: torch.Tensor | None, vocab_size: int) -> tuple[int, torch.Tensor | None]:
    """logits: (Vd,) -> (draft id, q over the full target vocabulary or None when greedy)."""
    if temperature <= 0:
        return int(torch.argmax(logits)), None
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    token = int(torch.multinomial(probs.cpu(), 1, generator=generator))
    return token, full_vocab_probs(probs, d2t, vocab_size)


def grow_tree(root_logprobs: torch.Tensor, expand, spec, *, max_depth: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Grow a draft tree; returns (tokens (n,) draft ids, parents (n,)) in topological order.

    root_logprobs: (Vd,) distribution of the first draft token. `expand(nodes, depth, tokens, parents)` returns
    (len(nodes), Vd) log-probabilities of the children of `nodes` (indices into the growing tokens/parents
    lists, all at `depth`, 1-based). Static specs take the listed top-k ranks; dynamic ones (EAGLE-2) keep
    the `top_k` best by cumulative log-prob at each depth and return the `total_tokens` best overall.
    """
    tokens: list[int] = []
    parents: list[int] = []
    if spec.is_static:
        from serve.tree import static_tree_parents

        choices = tuple(c for c in spec.static_choices if len(c) <= max_depth)
        tree_parents, ordered = static_tree_parents(choices)
        dist: dict[int, torch.Tensor] = {-1: root_logprobs}
        for depth in range(1, max(len(c) for c in ordered) + 1):
            level = [i for i, c in enumerate(ordered) if len(c) == depth]
            for i in level:
                ranks = torch.topk(dist[tree_parents[i]], ordered[i][-1] + 1).indices
                tokens.append(int(ranks[-1]))
                parents.append(tree_parents[i])
            expandable = [i for i in level if any(p == i for p in tree_parents)]
            if expandable:
                rows = expand(expandable, depth, tokens, parents)
                dist.update({i: rows[j] for j, i in enumerate(expandable)})
        return torch.tensor(tokens, dtype=torch.long), torch.tensor(parents, dtype=torch.long)

    scores: list[float] = []
    depths: list[int] = []
    top = torch.topk(root_logprobs, min(spec.top_k, root_logprobs.numel()))
    frontier = []
    for lp, tok in zip(top.values.tolist(), top.indices.tolist()):
        frontier.append(len(tokens))
        tokens.append(tok), parents.append(-1), scores.append(lp), depths.append(1)
    for depth in range(1, min(spec.depth, max_depth)):
        rows = expand(frontier, depth, tokens, parents)  # (n_f, Vd)
        child = torch.topk(rows, min(spec.top_k, rows.shape[-1]), dim=-1)
        base = torch.tensor([scores[i] for i in frontier], dtype=rows.dtype, device=rows.device)
        cumulative = (base[:, None] + child.values).flatten()  # (n_f * top_k,)
        new = []
        for flat, score in enumerate(cumulative.tolist()):
            f, r = divmod(flat, child.values.shape[1])
            new.append(len(tokens))
            tokens.append(int(child.indices[f, r])), parents.append(frontier[f])
            scores.append(score), depths.append(depth + 1)
        best = torch.topk(cumulative, min(spec.top_k, cumulative.numel())).indices.tolist()
        frontier = [new[b] for b in sorted(best)]
    # The best nodes by cumulative log-prob; a parent always outranks its child (log-probs <= 0, then depth).
    order = sorted(range(len(tokens)), key=lambda i: (-scores[i], depths[i], i))[: spec.total_tokens]
    keep = sorted(order, key=lambda i: (depths[i], i))  # topological: parents first
    remap = {old: new for new, old in enumerate(keep)}
    out_parents = [remap[parents[i]] if parents[i] >= 0 else -1 for i in keep]
    return (torch.tensor([tokens[i] for i in keep], dtype=torch.long),
            torch.tensor(out_parents, dtype=torch.long))
