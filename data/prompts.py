"""Prompt sources -> `PromptRow(id, domain, messages)`.

Accepted sources (DESIGN.md, "Prompt files"):
- a JSONL file whose rows have one of `messages` (OpenAI chat list), `conversations` (ShareGPT
  `from`/`value`), `turns` (MT-bench: a list of user turns), `prompt`, `question`, or `instruction`
  (+ optional `input`); an optional `system` string becomes a system message;
- an HF `datasets` folder (`save_to_disk` or a folder of data files) or a dataset name already in the
  local cache, with `split`;
- `builtin` / `builtin:<domain>`: the project's own prompt sets (data/builtin/);
- a traffic folder of `draftsmith serve --record`: the recorded chat conversations, without their answers.

The domain comes from the field named by `domain_field`, falling back to `category`, else `default`; a
source written `DOMAIN=source` (e.g. `code=humaneval.jsonl`) sets the domain of all its rows.
`read_prompts` reads a list of sources: every command that takes prompts (data build, eval) reads them there.
`messages` is the conversation so far: system and user turns plus any assistant turns the row gives.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.core.traffic import is_traffic_folder, traffic_prompt_records

FORMS = ("messages", "conversations", "turns", "prompt", "question", "instruction")
ROLES = ("system", "user", "assistant")
_SHAREGPT_ROLES = {"system": "system", "human": "user", "user": "user", "gpt": "assistant",
                   "assistant": "assistant", "chatgpt": "assistant", "bing": "assistant"}
_ID_FIELDS = ("id", "task_id", "question_id", "prompt_id")
_LABEL = re.compile(r"^[A-Za-z0-9_.\-]+$")


@dataclass
class PromptRow:
    id: str
    domain: str
    messages: list[dict]  # [{"role": "system"|"user"|"assistant", "content": str}, ...]


class PromptFormatError(DraftsmithError):
    """A prompt row that cannot be read; the message names the file and line (or row index)."""


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"`{what}` must be a string, got {type(value).__name__}")
    if not value.strip():
        raise ValueError(f"`{what}` is empty")
    return value


def _chat_list(items: Any, *, role_key: str, content_key: str, roles: dict[str, str], what: str) -> list[dict]:
    if not isinstance(items, list) or not items:
        raise ValueError(f"`{what}` must be a non-empty list of turns")
    messages = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or role_key not in item or content_key not in item:
            raise ValueError(f"`{what}[{i}]` must be an object with `{role_key}` and `{content_key}`")
        role = roles.get(str(item[role_key]).lower())
        if role is None:
            raise ValueError(f"`{what}[{i}]` has role {item[role_key]!r}; expected one of {', '.join(sorted(roles))}")
        messages.append({"role": role, "content": _text(item[content_key], f"{what}[{i}].{content_key}")})
    return messages


def row_messages(record: dict) -> list[dict]:
    """The conversation a record holds, in the first of FORMS it has. ValueError says what is wrong."""
    if not isinstance(record, dict):
        raise ValueError(f"a row must be a JSON object, got {type(record).__name__}")
    if record.get("messages") is not None:
        messages = _chat_list(record["messages"], role_key="role", content_key="content",
                              roles={r: r for r in ROLES}, what="messages")
    elif record.get("conversations") is not None:
        messages = _chat_list(record["conversations"], role_key="from", content_key="value",
                              roles=_SHAREGPT_ROLES, what="conversations")
    elif record.get("turns") is not None:
        turns = record["turns"]
        if not isinstance(turns, list) or not turns:
            raise ValueError("`turns` must be a non-empty list of user turns")
        messages = [{"role": "user", "content": _text(t, f"turns[{i}]")} for i, t in enumerate(turns)]
    elif record.get("prompt") is not None:
        messages = [{"role": "user", "content": _text(record["prompt"], "prompt")}]
    elif record.get("question") is not None:
        messages = [{"role": "user", "content": _text(record["question"], "question")}]
    elif record.get("instruction") is not None:
        content = _text(record["instruction"], "instruction")
        extra = record.get("input")
        if isinstance(extra, str) and extra.strip():
            content = f"{content}\n\n{extra}"
        messages = [{"role": "user", "content": content}]
    else:
        raise ValueError(f"row has none of {', '.join(FORMS)} (its keys: {', '.join(sorted(record)) or 'none'})")
    if record.get("system") and messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": _text(record["system"], "system")})
    if not any(m["role"] == "user" for m in messages):
        raise ValueError("the conversation has no user turn")
    return messages


def row_domain(record: dict, domain_field: str) -> str:
    for key in (domain_field, "category"):
        value = record.get(key)
        if value is not None and str(value).strip():
            return str(value).strip()
    return "default"


def row_id(record: dict, fallback: str) -> str:
    for key in _ID_FIELDS:
        if record.get(key) is not None and str(record[key]).strip():
            return str(record[key])
    return fallback


def rows_from_records(records: Iterable[tuple[str, dict]], *, domain_field: str, stem: str,
                      limit: int | None) -> list[PromptRow]:
    """records: (where, record) pairs, `where` naming the file:line or dataset row for errors."""
    rows: list[PromptRow] = []
    for index, (where, record) in enumerate(records):
        if limit is not None and len(rows) >= limit:
            break
        try:
            messages = row_messages(record)
        except ValueError as err:
            raise PromptFormatError(f"{where}: {err}") from None
        rows.append(PromptRow(id=row_id(record, f"{stem}-{index}"), domain=row_domain(record, domain_field),
                              messages=messages))
    return rows


def _not_utf8(path: Path, where: str, raw: bytes, err: UnicodeDecodeError) -> PromptFormatError:
    return PromptFormatError(f"{where}: not UTF-8 text (byte 0x{raw[err.start]:02x} at byte {err.start + 1}): save "
                             f"{path.name} as UTF-8, e.g. `iconv -f latin1 -t utf-8 {path} > fixed.jsonl`")


def _jsonl_records(path: Path) -> Iterator[tuple[str, dict]]:
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            try:
                line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
            except UnicodeDecodeError as err:
                raise _not_utf8(path, f"{path}:{lineno}", raw, err) from None
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise PromptFormatError(f"{path}:{lineno}: not valid JSON ({err.msg} at column {err.colno})") from None
            yield f"{path}:{lineno}", record


def _file_records(path: Path) -> Iterator[tuple[str, dict]]:
    """JSONL; a `.json` file holding one JSON array of rows is read too."""
    if path.suffix == ".json":
        raw = path.read_bytes()
        if raw.removeprefix(b"\xef\xbb\xbf").lstrip()[:1] == b"[":
            try:
                records = json.loads(raw.decode("utf-8-sig"))
            except UnicodeDecodeError as err:
                raise _not_utf8(path, str(path), raw, err) from None
            except json.JSONDecodeError as err:
                raise PromptFormatError(f"{path}:{err.lineno}: not valid JSON ({err.msg})") from None
            return ((f"{path} row {i}", rec) for i, rec in enumerate(records))
    return _jsonl_records(path)


def _dataset_records(source: str, split: str) -> tuple[Iterator[tuple[str, dict]], str]:
    import datasets

    path = Path(source)
    try:
        if path.is_dir() and ((path / "dataset_info.json").is_file() or (path / "dataset_dict.json").is_file()):
            loaded = datasets.load_from_disk(str(path))
        else:
            loaded = datasets.load_dataset(source, split=split)
    except (FileNotFoundError, ValueError, OSError, ConnectionError) as err:
        raise DraftsmithError(f"could not load prompts from {source!r}: {str(err).splitlines()[0]} (expected a JSONL "
                              f"file, a local HF datasets folder or cached name, or builtin[:<domain>])") from None
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise DraftsmithError(f"{source}: no split {split!r}; it has {', '.join(loaded)}")
        loaded = loaded[split]
    return ((f"{source}[{split}] row {i}", rec) for i, rec in enumerate(loaded)), path.name or source


def load_prompts(source: str | Path, *, domain_field: str = "domain", split: str = "train",
                 limit: int | None = None) -> list[PromptRow]:
    """Rows of `source` (see the module docstring), the first `limit` of them when given."""
    if limit is not None and limit <= 0:
        raise DraftsmithError(f"limit must be positive, got {limit}")
    text = str(source)
    if text == "builtin" or text.startswith("builtin:"):
        from draftsmith.data.builtin import builtin_files

        rows: list[PromptRow] = []
        for path in builtin_files(text.partition(":")[2] or None):
            rows += rows_from_records(_jsonl_records(path), domain_field=domain_field, stem=path.stem, limit=None)
        return rows[:limit] if limit is not None else rows
    path = Path(text).expanduser()
    if path.is_file():
        records, stem = _file_records(path), path.stem
    elif is_traffic_folder(path):
        records, stem = traffic_prompt_records(path), path.name
    elif path.exists():
        records, stem = _dataset_records(str(path), split)
    elif text.startswith((".", "/", "~")) or text.endswith((".jsonl", ".json")):
        raise DraftsmithError(f"prompt file not found: {path}")
    else:
        records, stem = _dataset_records(text, split)
    rows = rows_from_records(records, domain_field=domain_field, stem=stem, limit=limit)
    if not rows:
        raise DraftsmithError(f"no prompts in {source} (the file or split is empty)")
    return rows


def make_ids_unique(rows: list) -> list:
    """Suffix repeated row ids with `#n` (the second `a` becomes `a#1`), in place; returns rows."""
    seen: dict[str, int] = {}
    for row in rows:
        n = seen.get(row.id, 0)
        seen[row.id] = n + 1
        if n:
            row.id = f"{row.id}#{n}"
    return rows


def split_label(source: str) -> tuple[str | None, str]:
    """`code=path.jsonl` -> ("code", "path.jsonl"); a plain source -> (None, source)."""
    if "=" in source and not Path(source).exists():
        label, rest = source.split("=", 1)
        if _LABEL.match(label) and rest:
            return label, rest
    return None, source


def limit_per_domain(rows: Iterable[Any], limit: int | None) -> list[Any]:
    """Keep the first `limit` rows of each domain (all when limit is None), in their original order."""
    if limit is not None and limit <= 0:
        raise DraftsmithError(f"limit must be positive, got {limit}")
    kept, counts = [], {}
    for row in rows:
        n = counts.get(row.domain, 0)
        if limit is None or n < limit:
            kept.append(row)
            counts[row.domain] = n + 1
    return kept


def read_prompts(sources: Sequence[str], *, domain_field: str = "domain", split: str = "train",
                 limit: int | None = None, per_domain_limit: int | None = None) -> list[PromptRow]:
    """Rows of every source in order (`DOMAIN=source` labels applied, the first `limit` rows of each source),
    ids made unique across sources (`#n` on repeats), then the first `per_domain_limit` rows of each domain."""
    rows: list[PromptRow] = []
    for source in sources:
        label, path = split_label(source)
        loaded = load_prompts(path, domain_field=domain_field, split=split, limit=limit)
        for row in loaded:
            row.domain = label or row.domain
        rows += loaded
    if not rows:
        raise DraftsmithError(f"no prompts found in {', '.join(sources)}")
    make_ids_unique(rows)
    return limit_per_domain(rows, per_domain_limit)
