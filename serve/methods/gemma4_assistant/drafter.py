"""Gemma 4's assistant as a drafter: transformers' `Gemma4AssistantForCausalLM` (a few decoder layers that hold no
keys or values of their own) drafting K tokens from one position, as transformers'
`SinglePositionMultiTokenCandidateGenerator` (generation/candidate_generator.py) drives it.

    x_0 = cat(target.embed(pending), h)          (1, 1, 2H): h the target's final normed state before `pending`
    out_i = assistant(x_i, position_ids=[[p]], shared_kv_states=kv)  p = positions the target has seen, all i
    d_{i+1} = argmax / a draw of out_i.logits;   x_{i+1} = cat(target.embed(d_{i+1}), out_i.last_hidden_state)

`kv` are the target's own keys and values of its last full-attention and last sliding-attention layer (the layers
Gemma 4's config marks "store"), read from the decoder's cache (`Drafter.watch_cache`: the batch-1 decoder's
DynamicCache, or the batched decoder's view of the row in its slot cache) at each proposal: it then holds exactly the
tokens the target has seen, the pending one not included. The sliding layer's are its last `sliding_window - 1`
positions, those the target's own next query attends to besides itself. The rows of a batch draft together
(`propose_rows`): one assistant forward per draft position, each row's keys and values left-padded and masked.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, ClassVar

import torch

from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.core.layers import FINAL
from draftsmith.serve.core.target import Target
from draftsmith.serve.core.target_config import text_config
from draftsmith.serve.drafters.base import Draft, Drafter
from draftsmith.serve.drafters.heads_common import confidence_signal, sample_chain_token
from draftsmith.serve.drafters.length import FixedLength, LastDraft, LengthPolicy

ASSISTANT_TYPE = "gemma4_assistant"
TARGET_TYPES = ("gemma4_text",)  # a multimodal `gemma4` target's text config is one of these
LAYER_TYPES = ("full_attention", "sliding_attention")  # the shared_kv_states keys the assistant's layers read


class AssistantError(DraftsmithError):
    """An assistant folder that is not one, or one that cannot draft for this target."""


def read_assistant_config(folder: str | Path) -> Any:
    """The Gemma4AssistantConfig of `folder`; AssistantError when it holds none."""
    from transformers import AutoConfig

    from draftsmith.serve.drafters.folder import is_drafter_folder

    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise AssistantError(f"{folder} is not a Gemma 4 assistant folder: no config.json (expected a folder that "
                             f"Gemma4AssistantForCausalLM.save_pretrained writes)")
    if is_drafter_folder(folder):
        raise AssistantError(f"{folder} is a draftsmith drafter folder, not a Gemma 4 assistant's transformers folder: "
                             f"draft with --drafter {folder}, continue training it with model.init_from={folder}, or "
                             f"write its transformers folder with `draftsmith export --drafter {folder} --format vllm`")
    try:
        config = AutoConfig.from_pretrained(folder)
    except (OSError, ValueError, KeyError) as err:
        raise AssistantError(f"{folder}'s config.json does not load: {str(err).splitlines()[0][:200]}") from None
    if config.model_type != ASSISTANT_TYPE:
        raise AssistantError(f"{folder} is a {config.model_type!r} model, not a Gemma 4 assistant "
                             f"(config.json model_type {ASSISTANT_TYPE!r})")
    return config


def store_layers(text: Any) -> dict[str, int]:
    """{layer type: index of the target's layer whose keys and values the assistant reads}: Gemma 4's "store"
    layers, the last of each type that computes its own (transformers' Gemma4TextConfig.kv_sharing_modes)."""
    modes = getattr(text, "kv_sharing_modes", None) or []
    return {text.layer_types[i]: i for i, mode in enumerate(modes) if mode == "store"}


def _attention_shape(text: Any, index: int) -> tuple[int, int]:
    """(key/value heads, head_dim) of layer `index` of a Gemma 4 text config (per layer: full layers differ)."""
    layer = text.per_layer_config[index]
    return int(layer.num_key_value_heads), int(layer.head_dim)


def check_pair(assistant: Any, target_config: Any, *, folder: str | Path, target_name: str) -> dict[str, int]:
    """AssistantError naming the first thing that keeps `assistant` (its config) from drafting for a target of
    `target_config`; else the target's store layers by type."""
    text = text_config(target_config)
    if getattr(text, "model_type", None) not in TARGET_TYPES:
        raise AssistantError(f"the Gemma 4 assistant {folder} drafts for a Gemma 4 target (gemma4 / gemma4_text), "
                             f"but {target_name} is a {getattr(text, 'model_type', None)!r} model")
    mine = assistant.get_text_config()
    if assistant.backbone_hidden_size != text.hidden_size:
        raise AssistantError(f"the Gemma 4 assistant {folder} was built for a target of hidden size "
                             f"{assistant.backbone_hidden_size} (backbone_hidden_size), but {target_name}'s is "
                             f"{text.hidden_size}: it is another target's assistant")
    if mine.vocab_size != text.vocab_size:
        raise AssistantError(f"the Gemma 4 assistant {folder} has a vocabulary of {mine.vocab_size} tokens, "
                             f"{target_name} of {text.vocab_size}: it is another target's assistant")
    stores = store_layers(text)
    if sorted(stores) != sorted(LAYER_TYPES):
        raise AssistantError(f"{target_name} has no layer of each attention type that keeps its own keys and values "
                             f"({dict(stores)}): a Gemma 4 assistant has nothing to attend to")
    for i, kind in enumerate(mine.layer_types):
        if _attention_shape(mine, i) != _attention_shape(text, stores[kind]):
            raise AssistantError(f"layer {i} of the Gemma 4 assistant {folder} ({kind}) reads "
                                 f"{_attention_shape(mine, i)} (key/value heads, head_dim) but {target_name}'s "
                                 f"layer {stores[kind]} holds {_attention_shape(text, stores[kind])}: it is another "
                                 f"target's assistant")
    return stores


def load_assistant(folder: str | Path, target: Target) -> tuple[Any, Any]:
    """(Gemma4AssistantForCausalLM in the target's dtype, on its device; the folder's tokenizer or None), checked
    against `target`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    config = read_assistant_config(folder)
    check_pair(config, target.config, folder=folder, target_name=target.name)
    param = next(target.model.parameters())
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # the loading bar of a model of a few layers says nothing
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=param.dtype)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    tokenizer = None
    if any((Path(folder) / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
        tokenizer = AutoTokenizer.from_pretrained(folder)
    return model.to(param.device).eval().requires_grad_(False), tokenizer


class AssistantDrafter(Drafter):
    """Drafts from the target's last feature and its own cache; its only state is where the target stands."""

    kind: ClassVar[str] = "gemma4_assistant"
    target_layers = (FINAL,)
    reads_target_cache: ClassVar[bool] = True
    shared_state: ClassVar[tuple[str, ...]] = ("cache",)  # a fork is handed its own; never copied

    def __init__(self, model, target: Target, *, folder: str | Path, tokenizer=None,
                 policy: LengthPolicy | None = None):
        self.model, self.folder, self.tokenizer = model.eval().requires_grad_(False), str(folder), tokenizer
        self.stores = check_pair(model.config, target.config, folder=folder, target_name=target.name)
        self.embed = target.model.get_input_embeddings()  # Gemma's scaled embedding, as the assistant was fed
        self.vocab = text_config(target.config).vocab_size
        self.window = int(text_config(target.config).sliding_window)  # the target's sliding layers' window
        self.policy = policy or FixedLength()
        self.last = LastDraft()
        self.cache = None  # the target's cache of the running generation (watch_cache)
        self.pending = -1  # the token the target has not seen yet
        self.feature: torch.Tensor | None = None  # (H,) the target's final state at the position before `pending`
        self.seen = 0  # positions the target's cache holds

    def check_target(self, target: Target) -> None:
        check_pair(self.model.config, target.config, folder=self.folder, target_name=target.name)
        if self.tokenizer is not None:
            from draftsmith.serve.methods.model.drafter import check_same_tokenizer

            check_same_tokenizer(target.tokenizer, self.tokenizer, what=f"the Gemma 4 assistant {self.folder}")

    def watch_cache(self, cache) -> None:
        self.cache = cache

    def begin(self, prompt_ids, next_tokens, hidden_states) -> None:
        self.pending, self.feature, self.seen = int(next_tokens[-1]), hidden_states[FINAL][-1], len(prompt_ids)
        self.last = LastDraft()
        self.policy.new_context()

    def commit(self, next_tokens, hidden_states) -> None:
        self.last.settle(self.policy, next_tokens)
        self.pending, self.feature = int(next_tokens[-1]), hidden_states[FINAL][-1]
        self.seen += len(next_tokens)

    def shared_kv_states(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """{layer type: (keys, values)} (1, kv_heads, S, head_dim) of the target's store layers, from its cache: the
        full layer's `seen` positions, the sliding layer's last `window - 1` of them."""
        if self.cache is None:
            raise DraftsmithError("the Gemma 4 assistant attends to the target's own keys and values, which this "
                                  "decoder does not hand to drafters (Drafter.watch_cache)")
        kv = {}
        for kind, index in self.stores.items():
            layer = self.cache.layers[index]
            keys, values = layer.keys, layer.values
            if kind == "sliding_attention":  # a batch-1 cache may still hold the whole prompt, a slot cache holds all
                keys, values = keys[:, :, -(self.window - 1):], values[:, :, -(self.window - 1):]
            elif keys.shape[2] != self.seen:
                raise DraftsmithError(f"the target's cache holds {keys.shape[2]} positions in layer {index}, but "
                                      f"it has seen {self.seen} tokens: the assistant was driven out of step")
            kv[kind] = (keys, values)
        return kv

    def _chain(self, k: int, temperature: float, generator):
        """A chain proposal as steps: yields (token, state (H,)) for the assistant to read next and is sent back that
        step's (logits (V,), state (H,)); returns the Draft. `propose_rows` runs the steps of all rows at once."""
        token, state = self.pending, self.feature
        drafted, dists, declined = [], [], []
        self.policy.start(k, sampled=temperature > 0)
        for i in range(k):
            logits, state = yield token, state
            # decided from the draft distribution before sampling from it: a sampled chain stays exact
            if not self.policy.offer(confidence_signal(logits, min(i, 1))):
                declined = [int(logits.argmax())] if temperature <= 0 else []
                break
            token, q = sample_chain_token(logits, temperature=temperature, generator=generator, d2t=None,
                                          vocab_size=self.vocab)
            drafted.append(token)
            if q is not None:
                dists.append(q)
            if not self.policy.wants_more():
                break
        self.last.tokens = drafted + declined  # a greedy draft left out is still learned from
        return Draft(torch.tensor(drafted, dtype=torch.long), q=torch.stack(dists) if dists else None)

    def propose(self, k, *, temperature=0.0, generator=None, tree=None) -> Draft:
        return _draft_rows([self], [dict(k=k, temperature=temperature, generator=generator)])[0]

    @classmethod
    def propose_rows(cls, drafters: list["AssistantDrafter"], calls: list[dict]) -> list[Draft]:
        """The rows' chains drafted together (`_draft_rows`); a subclass that proposes otherwise, row by row."""
        if any(type(d).propose is not AssistantDrafter.propose for d in drafters):
            return super().propose_rows(drafters, calls)
        return _draft_rows(drafters, calls)


@torch.inference_mode()
def _draft_rows(drafters: list[AssistantDrafter], calls: list[dict]) -> list[Draft]:
    """Every row's chain (calls[i]: k, temperature, generator), one assistant forward per draft position for all rows:
    each row's query at its own position over its own keys and values, left-padded to the longest row's and masked
    (transformers' 2-D padding mask, which the assistant's forward cuts to each layer type's last columns). A row whose
    chain ended idles in the batch until the longest one ends."""
    drafts = [Draft.empty()] * len(drafters)
    rows = [i for i, d in enumerate(drafters) if d.last.open(d.policy)]
    if not rows:
        return drafts
    group = [drafters[i] for i in rows]
    first = group[0]
    device = first.model.device
    kv, attention_mask = _left_padded([d.shared_kv_states() for d in group], [d.seen for d in group])
    position_ids = torch.tensor([[d.seen] for d in group], device=device)  # (B, 1): every step at the pending's
    chains, requests = {}, {}
    for r, (d, i) in enumerate(zip(group, rows)):
        call = calls[i]
        chains[r] = d._chain(call["k"], call.get("temperature", 0.0), call.get("generator"))
        try:
            requests[r] = next(chains[r])
        except StopIteration as done:
            drafts[i] = done.value
    token_ids = torch.zeros(len(group), 1, dtype=torch.long)
    hidden = torch.zeros(len(group), 1, first.feature.shape[-1], device=device, dtype=first.feature.dtype)
    while requests:
        start = time.perf_counter()
        for r, (token, state) in requests.items():
            token_ids[r, 0], hidden[r, 0] = token, state
        embeds = first.embed(token_ids.to(device)).to(hidden.dtype)  # (B, 1, H): Gemma's scaled embedding
        inputs_embeds = torch.cat([embeds, hidden], dim=-1)  # (B, 1, 2H)
        out = first.model(inputs_embeds=inputs_embeds, position_ids=position_ids, attention_mask=attention_mask,
                          shared_kv_states=kv)
        stepped = list(requests)
        logits = out.logits[stepped, -1].float().cpu()  # (m, V)
        share = (time.perf_counter() - start) / len(stepped)
        for m, r in enumerate(stepped):
            group[r].policy.record_step(share)
            try:  # the next step reads the assistant's post_projection of this one
                requests[r] = chains[r].send((logits[m], out.last_hidden_state[r, -1]))
            except StopIteration as done:
                drafts[rows[r]] = done.value
                del requests[r]
    return drafts


def _left_padded(kvs: list[dict], lengths: list[int]) -> tuple[dict, torch.Tensor | None]:
    """Rows' {layer type: (keys, values) (1, kv_heads, S_r, head_dim)} -> {layer type: (B, kv_heads, max S_r,
    head_dim)}, each row at the right end (left-padded with zeros), and the (B, max lengths) mask of the full layer's
    real columns (None for one row). A row's sliding keys are the last min(length, window - 1) of its full ones', so
    the mask's last columns are theirs, as the assistant's forward reads them."""
    if len(kvs) == 1:
        return kvs[0], None
    stacked = {}
    for kind in kvs[0]:
        width = max(kv[kind][0].shape[2] for kv in kvs)
        pair = []
        for part in (0, 1):
            like = kvs[0][kind][part]
            out = like.new_zeros(len(kvs), like.shape[1], width, like.shape[3])  # (B, kv_heads, width, head_dim)
            for r, kv in enumerate(kvs):
                held = kv[kind][part]
                out[r, :, width - held.shape[2]:] = held[0]
            pair.append(out)
        stacked[kind] = tuple(pair)
    width = max(lengths)
    mask = torch.arange(width)[None, :] >= width - torch.tensor(lengths)[:, None]  # (B, width)
    return stacked, mask.long().to(stacked["full_attention"][0].device)
