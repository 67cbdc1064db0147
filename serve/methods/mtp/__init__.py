"""MTP: the target's own multi-token-prediction layer as a drafter (DeepSeek-V3, V3.2, GLM-4.5, Qwen3-Next, Qwen3.5,
ERNIE-4.5, Nemotron-H and MiMo-V2-Flash ship one), read from the target's checkpoint (`--drafter mtp`), fine-tuned
here for a fine-tuned target (`train model.method=mtp`, starting from the shipped layer where the target has one, from
a fresh layer of the target's own family where it has none), and loaded from the drafter folder that training writes
(`--drafter DIR`). Its head (head.py), where checkpoints keep it (shipped.py), its objective (objective.py), and what
the project asks of it (below)."""
from __future__ import annotations

from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.core.layers import FINAL
from draftsmith.serve.core.target import Target
from draftsmith.serve.drafters.eagle_drafter import EagleDrafter
from draftsmith.serve.drafters.spec import DrafterSpec, DrafterSpecError, options
from draftsmith.serve.methods.mtp.from_target import DEFAULT_K, shipped_head, start_from_shipped
from draftsmith.serve.methods.mtp.head import MtpHead, mtp_config
from draftsmith.serve.methods.mtp.merge import check_merge, export_merged
from draftsmith.serve.methods.mtp.objective import mtp_objective
from draftsmith.serve.methods.mtp.shipped import form_of, shipped_count
from draftsmith.serve.methods.registry import Method, register


def _config(model, target: Target):
    from draftsmith.serve.core.target import text_config

    text = text_config(target.config)
    form = form_of(text) if shipped_count(text, target.path) else None
    return mtp_config(target, num_speculative_tokens=model.num_speculative_tokens,
                      ttt_steps=min(model.ttt_steps, model.num_speculative_tokens),
                      norm_output=form.norm_output if form is not None else False,
                      overrides=dict(form.overrides) if form is not None else None)


def _parse(rest: str, common: dict) -> DrafterSpec:
    return DrafterSpec(kind="mtp", options=options(rest), **common)


def _build(parsed: DrafterSpec, target: Target, opts: dict):
    from draftsmith.serve.drafters.folder import DRAFTER_OPTIONS, make_drafter

    given = {**parsed.options, **opts}
    unknown = sorted(set(given) - {*DRAFTER_OPTIONS, "k"})
    if unknown:
        raise DrafterSpecError(f"unknown mtp option(s) {unknown}; valid: k, {', '.join(DRAFTER_OPTIONS)}")
    try:
        settings = {key: DRAFTER_OPTIONS[key](value) for key, value in given.items() if key != "k"}
        k = int(given.get("k", DEFAULT_K))
    except ValueError as err:
        raise DrafterSpecError(f"bad mtp option in {parsed.text!r}: {err}") from None
    try:
        head = shipped_head(target, num_speculative_tokens=k)
    except DraftsmithError as err:
        raise DrafterSpecError(str(err)) from None
    return make_drafter(head, target, **settings)


METHOD = register(Method(
    name="mtp", title="MTP", config=_config, head=MtpHead, drafter=EagleDrafter, objective=mtp_objective,
    layers=lambda num_layers: (FINAL,), unroll=lambda model, cfg, length: cfg.ttt_steps,
    position_weightings=("decay", "dpace"), usage="mtp, mtp:k=2", parse=_parse, build=_build, trees=True,
    label=lambda rest: "mtp", merge_check=check_merge, merge_export=export_merged, start=start_from_shipped))
