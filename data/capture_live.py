"""`data build --capture DIR`: the cache offline training reads, from the forwards that generate the answers.

The batched decoder keeps the states at the capture's layers of every token it reads (serve/batch/record.py); the
build writes them beside each finished part (data/recorded.py) and, once the dataset is saved, the capture
(data/capture.py) assembles the cache from them, forwarding only the rows it has none for (answers from a server,
`data.traffic` rows, kept answers, rows cut to max_length). The cache is the one `data capture` writes: the same
format, identity, resume and checks; the states files are deleted once it holds them.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from draftsmith.data.cache import storage_dtype
from draftsmith.data.capture import CaptureResult, capture_hidden_states, check_existing
from draftsmith.data.config import CaptureConfig, validate
from draftsmith.data.layers import resolve_layers
from draftsmith.data.made_for import TargetRecord
from draftsmith.data.out_folder import WORK
from draftsmith.data.recorded import RecordedOrigin, RecordedStates, remove_states
from draftsmith.serve.batch.record import Recording
from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.core.target import Target


@dataclass(frozen=True)
class LiveCapture:
    """A capture made while generating: where it goes, its settings, and what the decoder records."""
    out: Path
    config: CaptureConfig
    origin: RecordedOrigin  # what the recorded states are (data/recorded.py)
    recording: Recording  # what the batched decoder keeps


def plan_live_capture(target: Target, config: CaptureConfig, out: str | Path, *, dataset: Path) -> LiveCapture:
    """Check the capture's settings and folder before any answer is generated: bad layers, a folder that is the
    dataset's or holds another target's, layers' or dtype's cache: one line each, nothing written."""
    validate(config)
    out = Path(out)
    if out.resolve() == dataset.resolve() or dataset.resolve() in out.resolve().parents:
        raise DraftsmithError(f"--capture {out} lies in the dataset folder {dataset}, which a build replaces "
                              f"whole: give the cache its own folder")
    layers = resolve_layers(config.layers, target.num_layers)
    dtype_name, torch_dtype = storage_dtype(config.dtype)
    record = TargetRecord.of(target)
    check_existing(out, {"target_config_hash": record.config_hash, "tokenizer_hash": record.tokenizer_hash,
                         "target_weights": record.weights, "layers": list(layers.stored), "dtype": dtype_name},
                   record)
    origin = RecordedOrigin(layers=layers.stored, dtype=dtype_name,
                            target={"config_hash": record.config_hash, "tokenizer_hash": record.tokenizer_hash,
                                    "weights": record.weights})
    return LiveCapture(out=out, config=config, origin=origin,
                       recording=Recording(layers=layers.stored, dtype=torch_dtype))


def finish_live_capture(target: Target, dataset: Path, live: LiveCapture, *, progress: bool,
                        log: Callable[[str], None]) -> CaptureResult:
    """The cache of the saved dataset from the states recorded while generating (the other rows forwarded)."""
    work = dataset / WORK
    recorded = RecordedStates(work, live.origin)
    if recorded.foreign:
        log(f"data build: {recorded.foreign} parts of {work} were recorded with other layers, dtype or target "
            f"weights: their rows are forwarded again")
    result = capture_hidden_states(target, dataset, live.out, live.config, progress=progress, log=log,
                                   recorded=recorded)
    removed = remove_states(work)
    forwarded = result.tokens_captured - result.tokens_recorded
    log(f"data build: the cache took {result.tokens_recorded} tokens' states from the generating forwards and "
        f"forwarded {forwarded} ({result.shards_reused} shards reused); {removed} states files of {work} removed")
    return result
