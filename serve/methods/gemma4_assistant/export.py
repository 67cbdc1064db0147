"""The engines serve a Gemma 4 assistant from its own transformers folder (config.json model_type gemma4_assistant +
model.safetensors, as `Gemma4AssistantForCausalLM.save_pretrained` writes them): vLLM maps gemma4_assistant to its
`gemma4_mtp` model (`{"method": "mtp", "model": OUT}`), SGLang serves it as FROZEN_KV_MTP. So the export of a trained
assistant is that folder, whatever the format; the tensor names are checked against what vLLM 0.34.0's
`Gemma4MTP.load_weights` (model_executor/models/gemma4_mtp.py) consumes, then the folder is read back by transformers
(`--drafter gemma4_assistant:OUT`) and drafts token for token as the native drafter does.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.core.target import Target

# what each format's engine calls the method, and how it serves OUT beside the target
SERVING = {
    "vllm": ("mtp (gemma4_mtp)", "vllm serve {target} --speculative-config "
                                 "'{{\"method\": \"mtp\", \"model\": \"{out}\", \"num_speculative_tokens\": {k}}}'"),
    "sglang": ("FROZEN_KV_MTP", "python -m sglang.launch_server --model-path {target} --speculative-algorithm "
                                "FROZEN_KV_MTP --speculative-draft-model-path {out} --speculative-num-steps {k} "
                                "--speculative-eagle-topk 1 --speculative-num-draft-tokens {k1}"),
}
LAYER_TENSORS = ("self_attn.q_proj.weight", "self_attn.o_proj.weight", "self_attn.q_norm.weight",
                 "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight", "input_layernorm.weight",
                 "post_attention_layernorm.weight", "pre_feedforward_layernorm.weight",
                 "post_feedforward_layernorm.weight", "layer_scalar")


def check_format(config, fmt: str) -> None:
    """Refuse, in one line, a format that does not serve a Gemma 4 assistant (before anything is read or written)."""
    if fmt not in SERVING:
        raise DraftsmithError(f"--format {fmt} cannot export a Gemma 4 assistant: vLLM and SGLang serve it from its "
                              f"own transformers folder; use --format {' or '.join(SERVING)}")


def engine_tensor_names(config) -> set[str]:
    """The checkpoint names vLLM 0.34.0's Gemma4MTP loads for an assistant of `config` (Gemma4AssistantConfig): its
    modules under the names transformers saves (the engine maps pre/post_projection and stacks gate/up itself)."""
    text = config.get_text_config()
    names = {"model.embed_tokens.weight", "model.norm.weight", "pre_projection.weight", "post_projection.weight"}
    names |= {f"model.layers.{i}.{name}" for i in range(text.num_hidden_layers) for name in LAYER_TENSORS}
    if text.attention_bias:
        names |= {f"model.layers.{i}.self_attn.{p}.bias" for i in range(text.num_hidden_layers)
                  for p in ("q_proj", "o_proj")}
    if config.use_ordered_embeddings:
        names |= {"masked_embedding.centroids.weight", "masked_embedding.token_ordering"}
    if not config.tie_word_embeddings:
        names.add("lm_head.weight")
    return names


def check_tensor_names(folder: Path, config) -> int:
    """The folder's tensors are those the engine loads, no more and no fewer; returns their count."""
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), framework="pt") as handle:
        stored = set(handle.keys())
    wanted = engine_tensor_names(config)
    if stored != wanted:
        raise DraftsmithError(f"the exported assistant's tensors differ from what vLLM's gemma4_mtp loads: missing "
                              f"{sorted(wanted - stored)[:4]}, unexpected {sorted(stored - wanted)[:4]}")
    return len(stored)


def export_assistant(native_dir: str | Path, fmt: str, out_dir: str | Path, *, target: Target, prompts=None,
                     k: int | None = None, max_new_tokens: int = 32, overwrite: bool = False, **unused):
    """Write OUT (the assistant's transformers folder), whole or not at all, read it back and compare its drafts with
    the native drafter's; returns the ExportReport (also OUT/export_report.json)."""
    from draftsmith.serve.core.whole_folder import whole_folder
    from draftsmith.serve.drafters.folder import load_head, make_drafter, read_config
    from draftsmith.serve.drafters.identity import check_target_identity
    from draftsmith.serve.export.common import record_readback
    from draftsmith.serve.export.destination import REPORT_NAME, check_destination
    from draftsmith.serve.export.report import ExportReport
    from draftsmith.serve.methods.gemma4_assistant.drafter import AssistantDrafter, load_assistant

    config = read_config(native_dir)
    check_format(config, fmt)
    check_target_identity(config, target)
    replaced = check_destination(out_dir, overwrite=overwrite)
    out = Path(out_dir)
    k = k or min(config.num_speculative_tokens, 5)
    serve_as, command = SERVING[fmt]
    with whole_folder(out, replace=overwrite) as folder:
        t0 = time.perf_counter()
        weight = target.model.get_input_embeddings().weight
        head = load_head(native_dir, device=weight.device, dtype=weight.dtype)
        head.assistant.save_pretrained(folder)
        report = ExportReport(format=fmt, method=config.method, out_dir=str(out), target=target.name,
                              native_dir=str(Path(native_dir)), export_seconds=time.perf_counter() - t0,
                              replaced=replaced or "")
        t1 = time.perf_counter()
        count = check_tensor_names(folder, head.assistant.config)
        report.checks.append(f"{count} tensors, named as vLLM 0.34.0's gemma4_mtp loads them (config.json model_type "
                             f"gemma4_assistant, architectures {head.assistant.config.architectures})")
        model, _ = load_assistant(folder, target)  # transformers' Gemma4AssistantForCausalLM.from_pretrained
        readback = AssistantDrafter(model, target, folder=out)
        record_readback(report, target, make_drafter(head, target), readback, prompts, k=k,
                        max_new_tokens=max_new_tokens, where=str(out),
                        read_as="by transformers (gemma4_assistant:OUT)")
        report.notes.append(f"served as {serve_as}: " + command.format(target=target.path or target.name,
                                                                       out=out.resolve(), k=k, k1=k + 1))
        report.validate_seconds = time.perf_counter() - t1
        (folder / REPORT_NAME).write_text(json.dumps(report.to_dict(), indent=2) + "\n")
    return report
