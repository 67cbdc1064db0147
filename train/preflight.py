"""What a training run checks before it creates its out folder, so that a refused run leaves nothing behind: the
data was made for this run's target (before any weight is loaded), its token ids are in the target's vocabulary,
and the training rows fill one global batch."""
from __future__ import annotations

from pathlib import Path

from draftsmith.data.made_for import TargetRecord, cache_record, check_made_for, dataset_record, probe_target
from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.train.config import TrainConfig


def check_data_target(config: TrainConfig) -> list[str]:
    """DraftsmithError (one line naming both targets) when a dataset or cache the config names was made for
    another target (data/made_for.py); the notes to print when data.allow_other_target lets a fine-tune through.
    Reads the target's config and tokenizer only, and only when the data records a target."""
    data = config.data
    if data.mode == "online":
        found = [(folder, dataset_record(folder), "dataset") for folder in (data.dataset, data.eval_dataset) if folder]
    else:
        found = [(folder, cache_record(folder), "cache") for folder in (data.cache, data.eval_cache) if folder]
    found = [(folder, made, kind) for folder, made, kind in found if made is not None]
    if not found:
        return []
    spec = config.target.spec
    run = TargetRecord.of(probe_target(spec))
    notes = []
    for folder, made, kind in found:
        if kind == "dataset":
            what, remake = f"{folder} was built", f"rebuild it with `draftsmith data build --target {spec} ...`"
        else:
            what = f"the cache {folder} was captured"
            remake = f"capture it again with `draftsmith data capture --target {spec} --dataset DATASET --out NEW`"
        note = check_made_for(made, run, what=what, remake=remake, allow_other=data.allow_other_target)
        if note:
            notes.append(note)
    return notes


def max_token_id(dataset) -> int:
    """The largest id in an HF dataset's input_ids column (-1 when empty), read from its Arrow table at C speed."""
    import pyarrow.compute as pc

    largest = pc.max(pc.list_flatten(dataset.data.column("input_ids"))).as_py()
    return -1 if largest is None else int(largest)


def check_token_ids(rows, vocab_size: int, *, where: str | Path) -> None:
    """DraftsmithError when a dataset holds token ids the target's embedding has no row for (a dataset tokenized
    by another tokenizer that records no target), instead of an IndexError inside the target's forward."""
    dataset = getattr(rows, "dataset", None)
    if dataset is None:  # a cache: its ids went through the target's forward when it was captured
        return
    largest = max_token_id(dataset)
    if largest >= vocab_size:
        raise DraftsmithError(f"{where} holds token id {largest} but the target's vocabulary has {vocab_size} ids: "
                              f"it was tokenized for another target; rebuild it with `draftsmith data build` and "
                              f"this target")


def check_rows_fill_a_batch(train_rows: int, *, batch_size: int, grad_accum: int, world: int) -> None:
    """DraftsmithError when the training rows are fewer than one global batch (no step could run)."""
    global_batch = batch_size * world * grad_accum
    if train_rows < global_batch:
        raise DraftsmithError(f"{train_rows} training rows are fewer than one global batch ({global_batch} = "
                              f"batch_size x processes x grad_accum)")
