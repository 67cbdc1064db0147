"""The traffic folder: what `draftsmith serve --record DIR` answered, kept as training data for the drafter. The
server writes it; data/ and train/ read it, so its format lives in the core.

Every answer the server returns is the target's own output for a real prompt: what self-distillation tries
to produce. The recorder appends one JSON line per answered request to size-rotated segments:

    DIR/manifest.json          the target (name, config and tokenizer hashes): a server of another target refuses DIR
    DIR/traffic-NNNNN.jsonl    {"id", "time", "endpoint", "domain", "messages" (chat) | "prompt" (completions),
                                "prompt_token_ids", "output_token_ids", "finish_reason",
                                "sampling": {"temperature", "top_p", "top_k", "seed", "max_tokens"}, "mu"}
    DIR/summary.json           requests, prompt and output tokens per domain, requests not recorded

A request opts out with `"store": false` (the OpenAI field): nothing of it is written, it is only counted.
Its domain comes from `metadata.domain` (default `default`).

Readers (`data build --traffic`, `train data.dataset=DIR`, `--prompts DIR` for `data build` and `eval`) use
`traffic_rows` (exact ids: the prompt, then the answer in the loss) and `traffic_prompt_records` (the chat
conversations without their answers). Lines are written whole and flushed; a torn last line (a crash
mid-write) is skipped when read.
"""
from __future__ import annotations

import json
import os
import threading
import time
import uuid
from pathlib import Path
from typing import Iterator, TYPE_CHECKING

from draftsmith.serve.core.errors import DraftsmithError

if TYPE_CHECKING:  # annotations only: the target's module imports torch
    from draftsmith.serve.core.target import Target

MANIFEST = "manifest.json"
SUMMARY = "summary.json"
SEGMENT = "traffic-{:05d}.jsonl"
FORMAT = "draftsmith-traffic"
FORMAT_VERSION = 1


class TrafficError(DraftsmithError):
    """A traffic folder that cannot be written or read as asked."""


def is_traffic_folder(path: str | Path) -> bool:
    manifest = Path(path) / MANIFEST
    if not manifest.is_file():
        return False
    try:
        return json.loads(manifest.read_text()).get("format") == FORMAT
    except (json.JSONDecodeError, AttributeError):
        return False


def read_manifest(path: str | Path) -> dict:
    if not is_traffic_folder(path):
        raise TrafficError(f"{path} is not a traffic folder (no {MANIFEST} of `draftsmith serve --record`)")
    return json.loads((Path(path) / MANIFEST).read_text())


class TrafficRecorder:
    """Appends answered requests to DIR; called from the server's event loop (a lock guards the files anyway)."""

    def __init__(self, folder: str | Path, *, target: Target, max_segment_bytes: int = 64 << 20):
        self.folder = Path(folder)
        self.max_segment_bytes = max_segment_bytes
        identity = {"format": FORMAT, "version": FORMAT_VERSION, "target": target.name,
                    "config_hash": target.config_hash, "tokenizer_hash": target.tokenizer_hash}
        self.folder.mkdir(parents=True, exist_ok=True)
        if (self.folder / MANIFEST).is_file():
            old = read_manifest(self.folder)
            if (old.get("config_hash"), old.get("tokenizer_hash")) != (target.config_hash, target.tokenizer_hash):
                raise TrafficError(f"{self.folder} holds traffic of target {old.get('target')!r} (another model or "
                                   f"tokenizer than {target.name!r}); record into another folder")
        else:
            _write_atomic(self.folder / MANIFEST, json.dumps({**identity, "created": time.time()}, indent=1))
        self.summary = self._load_summary()
        segments = sorted(self.folder.glob("traffic-*.jsonl"))
        self.segment = int(segments[-1].stem.split("-")[1]) if segments else 0
        self._lock = threading.Lock()

    def _load_summary(self) -> dict:
        path = self.folder / SUMMARY
        if path.is_file():
            return json.loads(path.read_text())
        return {"requests": 0, "not_recorded": 0, "prompt_tokens": 0, "output_tokens": 0, "domains": {}}

    def record(self, *, endpoint: str, domain: str, store: bool, prompt_token_ids: list[int],
               output_token_ids: list[int], finish_reason: str, sampling: dict, messages: list[dict] | None = None,
               prompt: str | None = None, mu: float | None = None) -> None:
        with self._lock:
            if not store:
                self.summary["not_recorded"] += 1
                self._write_summary()
                return
            line = json.dumps({"id": uuid.uuid4().hex, "time": time.time(), "endpoint": endpoint, "domain": domain,
                               "messages": messages, "prompt": prompt, "prompt_token_ids": list(prompt_token_ids),
                               "output_token_ids": list(output_token_ids), "finish_reason": finish_reason,
                               "sampling": sampling, "mu": mu}, ensure_ascii=False) + "\n"
            path = self.folder / SEGMENT.format(self.segment)
            if path.exists() and path.stat().st_size + len(line.encode()) > self.max_segment_bytes:
                self.segment += 1
                path = self.folder / SEGMENT.format(self.segment)
            with open(path, "a", encoding="utf-8") as fh:
                fh.write(line)
                fh.flush()
            s = self.summary
            s["requests"] += 1
            s["prompt_tokens"] += len(prompt_token_ids)
            s["output_tokens"] += len(output_token_ids)
            d = s["domains"].setdefault(domain, {"requests": 0, "prompt_tokens": 0, "output_tokens": 0})
            d["requests"] += 1
            d["prompt_tokens"] += len(prompt_token_ids)
            d["output_tokens"] += len(output_token_ids)
            self._write_summary()

    def _write_summary(self) -> None:
        self.summary["segments"] = self.segment + 1
        _write_atomic(self.folder / SUMMARY, json.dumps(self.summary, indent=1))


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def read_traffic(folder: str | Path) -> Iterator[dict]:
    """Every recorded request, oldest first (a torn last line of a segment is skipped)."""
    read_manifest(folder)
    for path in sorted(Path(folder).glob("traffic-*.jsonl")):
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                if not line.endswith("\n"):
                    break  # written while the server died
                if line.strip():
                    yield json.loads(line)


def traffic_rows(folder: str | Path, *, tokenizer_hash: str | None = None) -> dict[str, list]:
    """Columns id, domain, input_ids, loss_mask (a `data build` dataset's): the prompt's ids, then the answer's
    ids, the answer in the loss. `tokenizer_hash`: refuse traffic of another tokenizer."""
    manifest = read_manifest(folder)
    if tokenizer_hash is not None and manifest["tokenizer_hash"] != tokenizer_hash:
        raise TrafficError(f"{folder} was recorded with another tokenizer (target {manifest['target']!r}): its "
                           f"token ids mean other tokens for this target")
    columns: dict[str, list] = {"id": [], "domain": [], "input_ids": [], "loss_mask": []}
    for record in read_traffic(folder):
        prompt, output = record["prompt_token_ids"], record["output_token_ids"]
        if not output:
            continue
        columns["id"].append(f"traffic-{record['id']}")
        columns["domain"].append(record["domain"])
        columns["input_ids"].append(list(prompt) + list(output))
        columns["loss_mask"].append([0] * len(prompt) + [1] * len(output))
    if not columns["id"]:
        raise TrafficError(f"{folder} holds no recorded answers yet")
    return columns


def traffic_prompt_records(folder: str | Path) -> Iterator[tuple[str, dict]]:
    """(where, prompt record) of every recorded chat request: its conversation without the answer, for the
    prompt readers (data.prompts); raw completions have no conversation and are left out."""
    for index, record in enumerate(read_traffic(folder)):
        if record.get("messages"):
            yield (f"{folder} request {index}",
                   {"id": f"traffic-{record['id']}", "domain": record["domain"], "messages": record["messages"]})
