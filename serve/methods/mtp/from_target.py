"""A target's own MTP layer as a head: read from its checkpoint for drafting (`--drafter mtp`) or as where a
fine-tune starts (`train model.method=mtp`)."""
from __future__ import annotations

from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.core.target import Target
from draftsmith.serve.methods.mtp.head import MtpHead, layer_config, mtp_config
from draftsmith.serve.methods.mtp.shipped import (FORMS, form_of, head_state_from_checkpoint, holds_prefixed,
                                                  named_count, read_prefixed, shipped_count)

DEFAULT_K = 3  # chains of the `mtp` spec unless told otherwise (vLLM's MTP examples draft 1-3)


def shipped_head(target: Target, *, num_speculative_tokens: int = DEFAULT_K, cast: bool = True) -> MtpHead:
    """The MTP layer `target` ships, read from its checkpoint (cast: in the target's dtype, on its device; else in
    float32, on the CPU, as training starts from it); DraftsmithError when it ships none or its tensors do not fit."""
    from draftsmith.serve.core.target import text_config

    text = text_config(target.config)
    form = form_of(text)
    if form is None and named_count(text):
        raise DraftsmithError(f"the target {target.name}'s config names {named_count(text)} MTP layer(s), but "
                              f"draftsmith does not read {text.model_type}'s MTP checkpoint form yet (it reads "
                              f"{', '.join(sorted({f.title for f in FORMS.values()}))}): train one with "
                              f"`draftsmith train model.method=mtp`, then --drafter DIR")
    if not shipped_count(text, target.path):
        where = ("its config names none" if form is None or form.counts or not target.path else
                 f"its checkpoint holds no tensor under {form.prefix(text)!r}, where {form.title} keeps it")
        raise DraftsmithError(f"the target {target.name} ({text.model_type}) ships no MTP layer ({where}): train one "
                              f"with `draftsmith train model.method=mtp`, then --drafter DIR")
    if not target.path:
        raise DraftsmithError(f"the target {target.name} has no checkpoint folder to read its MTP layer from")
    prefix = form.prefix(text)
    if not holds_prefixed(target.path, prefix):
        raise DraftsmithError(f"the target {target.name}'s config says it ships {shipped_count(text)} MTP layer(s), "
                              f"but its checkpoint {target.path} holds no tensor under {prefix!r} ({form.title}); "
                              f"transformers drops them when it saves a model: use the original checkpoint")
    cfg = mtp_config(target, num_speculative_tokens=num_speculative_tokens, ttt_steps=num_speculative_tokens,
                     norm_output=form.norm_output, overrides=dict(form.overrides))
    head = MtpHead(cfg)
    _load_shipped(head, target)
    if not cast:
        return head
    param = next(target.model.parameters())
    return head.to(device=param.device, dtype=param.dtype)


def _load_shipped(head: MtpHead, target: Target) -> None:
    """`head` given the layer `target`'s checkpoint holds (converted by its family's transformers model)."""
    from draftsmith.serve.core.target import text_config

    text = text_config(target.config)
    form = form_of(text)
    state = head_state_from_checkpoint(read_prefixed(target.path, form.prefix(text)), form,
                                       layer_config(head.config.layer_config))
    source = f"{target.path} ({form.title})"
    own = head.state_dict()
    wrong = sorted(k for k, v in state.items() if k in own and tuple(v.shape) != tuple(own[k].shape))
    missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    if wrong or missing or unexpected:
        raise DraftsmithError(f"the MTP layer of {source} does not match this target's config: missing "
                              f"{missing[:4]}, unexpected {unexpected[:4]}, of another shape {wrong[:4]}")
    head.load_state_dict({k: v.to(own[k].dtype) for k, v in state.items()})


def start_from_shipped(head: MtpHead, target: Target) -> bool:
    """A fresh head of `target` given the layer it ships, when it ships one; whether it did. A config that names
    a layer its checkpoint lacks (a fine-tune saved by transformers, which drops them) starts fresh, saying so."""
    import sys

    from draftsmith.serve.core.target import text_config

    text = text_config(target.config)
    if not shipped_count(text, target.path):
        return False
    if not target.path or not holds_prefixed(target.path, form_of(text).prefix(text)):
        print(f"train: {target.name}'s config names an MTP layer its checkpoint does not hold (transformers drops "
              f"them when it saves a model); a fresh layer starts. To start from the shipped one, copy the "
              f"original checkpoint's {form_of(text).prefix(text)}* tensors into it", file=sys.stderr)
        return False
    _load_shipped(head, target)
    return True
