"""The engines serve MTP from the target's own checkpoint (vLLM `--speculative-config '{"method": "mtp", ...}'`,
mapped per architecture to its `*_mtp` model; SGLang `--speculative-algorithm NEXTN`): an MTP drafter exports as a
copy of the target checkpoint with the drafter's layer written where that family keeps it (shipped.py).

Every file of the target is copied as it is, except the shards that held an earlier MTP layer (rewritten without
it, their other tensors bit-identical) and the index, which names the new `model-mtp.safetensors`; the copy is
built in a temporary sibling of OUT and renamed into place, and the target's own folder is only read. The export is
then read back by draftsmith (`--drafter mtp` on OUT) and drafts token for token as the native drafter does.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import torch

from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.core.target import Target
from draftsmith.serve.methods.mtp.shipped import FORMS, INDEX, checkpoint_files, form_of, tensor_names

MTP_FILE = "model-mtp.safetensors"
# what each format's engine calls the method, and how it is served from OUT
SERVING = {
    "vllm": ("mtp", 'vllm serve {out} --speculative-config \'{{"method": "mtp", "num_speculative_tokens": {k}}}\''),
    "sglang": ("NEXTN", "python -m sglang.launch_server --model-path {out} --speculative-algorithm NEXTN "
                        "--speculative-num-steps {k} --speculative-eagle-topk 1 --speculative-num-draft-tokens {k1}"),
}


def check_merge(config, fmt: str) -> None:
    """Refuse, in one line, an MTP drafter a format cannot carry (before anything is read or written)."""
    from draftsmith.serve.core.families import family_of

    if fmt not in SERVING:
        raise DraftsmithError(f"--format {fmt} cannot export an MTP drafter: the engines serve MTP layers from the "
                              f"target's own checkpoint; use --format {' or '.join(SERVING)}")
    if config.target_model_type not in FORMS:
        family = family_of(config.target_model_type)
        raise DraftsmithError(f"--format {fmt} cannot export this MTP drafter: its target's family "
                              f"{config.target_model_type!r} ({family.causal_lm if family else 'unknown'}) has no MTP "
                              f"model in the engines (they serve MTP for DeepSeek-V3, V3.2, GLM-4.5, Qwen3-Next, "
                              f"Qwen3.5, ERNIE-4.5, Nemotron-H and MiMo-V2-Flash checkpoints); serve it with "
                              f"`draftsmith serve --drafter DIR`")


def merge_checkpoint(head, target: Target, folder: Path) -> dict:
    """Write into the empty `folder` a copy of the target's checkpoint with `head`'s layer as its MTP layer;
    returns what changed ({replaced: [names], added: [names], rewritten: [files]})."""
    from safetensors.torch import load_file, save_file

    from draftsmith.serve.core.target import text_config
    from draftsmith.serve.methods.mtp.head import layer_config
    from draftsmith.serve.methods.mtp.shipped import head_state_to_checkpoint

    text = text_config(target.config)
    form = form_of(text)
    prefix = form.prefix(text)
    source = Path(target.path)
    shards = checkpoint_files(source)
    state = {k: v.detach().cpu().contiguous() for k, v in head.state_dict().items()}
    tensors = {prefix + k: v.contiguous() for k, v in
               head_state_to_checkpoint(state, form, layer_config(head.config.layer_config)).items()}
    replaced, rewritten, weight_map = [], [], {}
    for path in sorted(source.iterdir()):
        if path.is_dir() or path.name == INDEX:
            continue
        if path in shards:
            names = tensor_names(path)
            old = [n for n in names if _replaced(n, prefix, form)]
            if old:  # an earlier MTP layer: the shard again without it (its copies of the target's tensors kept)
                kept = {k: v for k, v in load_file(str(path)).items() if not _replaced(k, prefix, form)}
                save_file(kept, str(folder / path.name), metadata={"format": "pt"})
                replaced += old
                rewritten.append(path.name)
                names = list(kept)
            else:
                shutil.copy2(path, folder / path.name)
            weight_map.update({name: path.name for name in names})
        else:
            shutil.copy2(path, folder / path.name)
    save_file(tensors, str(folder / MTP_FILE), metadata={"format": "pt"})
    weight_map.update({name: MTP_FILE for name in tensors})
    index = json.loads((source / INDEX).read_text()) if (source / INDEX).is_file() else {"metadata": {}}
    index["weight_map"] = dict(sorted(weight_map.items()))
    (folder / INDEX).write_text(json.dumps(index, indent=2) + "\n")
    config = json.loads((folder / "config.json").read_text())
    holder = config.get("text_config", config)
    key = form.counts[0] if form.counts else None  # MiMo-V2's configs name none: its tensors say it ships one
    if key and int(holder.get(key) or 0) < 1:  # a target that shipped none now names the one it carries
        holder[key] = 1
        (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return {"replaced": sorted(replaced), "added": sorted(tensors), "rewritten": rewritten}


def _replaced(name: str, prefix: str, form) -> bool:
    """Whether a checkpoint tensor is the MTP layer's own (replaced by an export), not a copy of the target's kept
    beside it (DeepSeek-V3's per-layer embeddings and head)."""
    return name.startswith(prefix) and name[len(prefix):] not in form.shared


def check_unchanged(source: Path, out: Path, prefix: str, form) -> int:
    """Every tensor of the target's checkpoint outside its MTP layer is in OUT, bit for bit; returns their count."""
    from contextlib import ExitStack

    from safetensors import safe_open

    count = 0
    with ExitStack() as files:  # each of OUT's shards opened once
        ours = {}
        for path in checkpoint_files(out):
            handle = files.enter_context(safe_open(str(path), framework="pt"))
            ours.update(dict.fromkeys(handle.keys(), handle))
        for path in checkpoint_files(source):
            with safe_open(str(path), framework="pt") as theirs:
                for name in theirs.keys():
                    if _replaced(name, prefix, form):
                        continue
                    if name not in ours:
                        raise DraftsmithError(f"the merged checkpoint lost the target's tensor {name}")
                    a, b = theirs.get_tensor(name), ours[name].get_tensor(name)
                    if a.dtype != b.dtype or a.shape != b.shape or not torch.equal(_bits(a), _bits(b)):
                        raise DraftsmithError(f"the merged checkpoint changed the target's tensor {name}")
                    count += 1
    return count


def _bits(tensor):
    """The tensor's bytes (bit-identical, NaNs included)."""
    return tensor.contiguous().view(-1).view(torch.uint8)


def export_merged(native_dir: str | Path, fmt: str, out_dir: str | Path, *, target: Target, prompts=None,
                  k: int | None = None, max_new_tokens: int = 32, overwrite: bool = False, **unused):
    """Write OUT (the merged checkpoint), whole or not at all, read it back and compare its drafts with the native
    drafter's; returns the ExportReport (also OUT/export_report.json)."""
    import time

    from draftsmith.serve.core.target import text_config
    from draftsmith.serve.core.whole_folder import whole_folder
    from draftsmith.serve.drafters.folder import load_head, make_drafter, read_config
    from draftsmith.serve.drafters.identity import check_target_identity
    from draftsmith.serve.export.common import record_readback
    from draftsmith.serve.export.destination import check_destination
    from draftsmith.serve.export.report import ExportReport
    from draftsmith.serve.methods.mtp.from_target import shipped_head

    config = read_config(native_dir)
    check_merge(config, fmt)
    check_target_identity(config, target)
    if overwrite:
        raise DraftsmithError("--overwrite cannot replace a merged MTP checkpoint: export into a new or empty folder")
    check_destination(out_dir, overwrite=False)
    out = Path(out_dir)
    text = text_config(target.config)
    prefix = form_of(text).prefix(text)
    k = k or min(config.num_speculative_tokens, 5)
    serve_as, command = SERVING[fmt]
    with whole_folder(out, replace=False) as folder:
        t0 = time.perf_counter()
        weight = target.model.get_input_embeddings().weight
        head = load_head(native_dir, device=weight.device, dtype=weight.dtype)
        changed = merge_checkpoint(head, target, folder)
        report = ExportReport(format=fmt, method=config.method, out_dir=str(out), target=target.name,
                              native_dir=str(Path(native_dir)), export_seconds=time.perf_counter() - t0)
        t1 = time.perf_counter()
        unchanged = check_unchanged(Path(target.path), folder, prefix, form_of(text))
        report.checks.append(f"{unchanged} tensors of the target's checkpoint copied bit for bit; MTP layer "
                             f"{len(changed['added'])} tensors under {prefix!r}"
                             + (f", replacing {len(changed['replaced'])} in {', '.join(changed['rewritten'])}"
                                if changed["replaced"] else ""))
        merged = replace(target, path=str(folder))  # the same model; its MTP layer read from OUT
        readback = make_drafter(shipped_head(merged, num_speculative_tokens=config.num_speculative_tokens), target)
        record_readback(report, target, make_drafter(head, target), readback, prompts, k=k,
                        max_new_tokens=max_new_tokens, where=str(out), read_as="as the checkpoint's MTP layer")
        report.notes.append(f"served as {serve_as}: {command.format(out=out.resolve(), k=k, k1=k + 1)}")
        report.validate_seconds = time.perf_counter() - t1
        (folder / "export_report.json").write_text(json.dumps(report.to_dict(), indent=2) + "\n")
    return report
