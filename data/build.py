"""Self-distillation: the target answers every prompt; the conversations become a tokenized HF dataset.

Output folder (`out_dir`):
    data-*.arrow, dataset_info.json, state.json   the dataset (`datasets.load_from_disk(out_dir)`), columns
                                                  id (str), domain (str), input_ids (list[int]), loss_mask (list[int])
    build_info.json                               target identity, config hash, counts, throughput
    config.resolved.yaml                          the DataBuildConfig used
    .work/state.json, .work/part-NNNNN.jsonl      finished rows, batch_size per part (the resume point)
    .work/part-NNNNN.states.safetensors           with `capture`: the hidden states of the part's rows, recorded
                                                  while generating, until the cache holds them (data/capture_live.py)

The folder is replaced whole when the dataset is saved (data/out_folder.py): a kill or a full disk then leaves the
earlier dataset as it was. A dataset whose rows no .work keeps is replaced only with `overwrite`.

Generation (data.generate): batch_size rows decode together, longest prompts first, and a row that ends hands
its slot to the next prompt at once. Resuming: every batch_size finished rows are written atomically to their
own part file; a new run reads every part, keeps those rows and answers only the rest. Each answer is sampled
from its own seed (row id and turn), so a resumed build equals an uninterrupted one, whatever rows shared a
batch; the batch size (or device) may also change between runs, e.g. to resume with a smaller batch after
running out of memory. The prompt set may change too (more prompts, another per_domain_limit): a finished row
is reused when its id and its non-assistant turns are unchanged, so a dataset grows without redoing what it has.
Settings that change what the target writes may not: the work folder remembers them and refuses a mismatch.
"""
from __future__ import annotations

import hashlib
import json
import time
import zlib
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from draftsmith.data.config import CaptureConfig, DataBuildConfig, validate
from draftsmith.data.generate import Answer, ContinuousBatcher, Request
from draftsmith.data.made_for import TargetRecord
from draftsmith.data.masks import render_prompt, render_with_mask
from draftsmith.data.out_folder import WORK, carry_over, check_out
from draftsmith.data.plan import Conversation, fit_prompt, keeps_answers, plan_conversation
from draftsmith.data.prompts import PromptRow, read_prompts
from draftsmith.serve.core.errors import DraftsmithError
from draftsmith.serve.core.files import write_text_atomic
from draftsmith.serve.core.target import Target, load_configured
from draftsmith.serve.core.traffic import read_manifest, traffic_rows
from draftsmith.serve.core.whole_folder import whole_folder

if TYPE_CHECKING:  # annotations only
    from draftsmith.data.capture import CaptureResult
    from draftsmith.data.capture_live import LiveCapture

BUILD_INFO = "build_info.json"
# Settings that do not change what the target writes: a build may resume with other values (a smaller batch
# after running out of memory, another device). With the same values a resumed build equals an uninterrupted one.
# A server (data.server) answers as the target does: its identity is checked before the first request.
_NOT_GENERATION = ("draft_vocab_size", "drop_unfinished", "device", "batch_size", "server", "traffic")
# Settings that choose which prompts are answered, not how: rows are reused one by one (see _reusable).
_PROMPT_SET = ("prompts", "domain_field", "split", "limit", "per_domain_limit")


@dataclass
class BuildResult:
    out_dir: Path
    rows: int
    tokens: int
    loss_tokens: int
    counts: dict[str, int]  # prompts, skipped_long_prompts, truncated_prompts, dropped_turns, ...
    domains: dict[str, int]
    generated_tokens: int  # by this run (reused batches excluded)
    generation_seconds: float
    generated_batches: int
    reused_batches: int  # part files of earlier runs read back from .work
    reused_rows: int  # rows those parts answered
    draft_vocab_coverage: float | None = None
    capture: CaptureResult | None = None  # with `cache_dir`: the cache written

    @property
    def tokens_per_second(self) -> float:
        return self.generated_tokens / self.generation_seconds if self.generation_seconds else 0.0


@dataclass
class _Planned:
    """A row to answer: its conversation and the prompt of its first empty slot (None: nothing to write)."""
    conversation: Conversation
    first_prompt: list[int] | None


@dataclass
class _InFlight:
    """What a conversation collects while the target answers its turns (see _record)."""
    conversation: Conversation
    finished: bool = True
    unfinished: list[int] = field(default_factory=list)  # message indices cut short at max_new_tokens
    last_turn: dict | None = None  # the latest answer's message index and exact token ids
    dropped: int = 0


@dataclass
class _Counts:
    prompts: int = 0
    skipped_long_prompts: int = 0
    truncated_prompts: int = 0
    dropped_turns: int = 0
    unfinished_answers: int = 0
    truncated_rows: int = 0
    empty_rows: int = 0
    dropped_unfinished_rows: int = 0
    traffic_rows: int = 0  # rows of data.traffic folders, added as served


def gather_prompts(config: DataBuildConfig) -> list[PromptRow]:
    """The rows `config` names (data.prompts.read_prompts)."""
    return read_prompts(config.prompts, domain_field=config.domain_field, split=config.split, limit=config.limit,
                        per_domain_limit=config.per_domain_limit)


def context_length(target: Target) -> int | None:
    from draftsmith.serve.core.target import text_config

    return getattr(text_config(target.config), "max_position_embeddings", None)


def _plan_rows(target: Target, rows: list[PromptRow], config: DataBuildConfig, max_length: int,
               counts: _Counts, done: set[str]) -> list[_Planned]:
    """The rows not in `done`, the most answers to write first, then the longest prompt; long prompts skipped or
    truncated (and counted, done or not).

    A conversation's turns run one after the other, so one started late holds the last slots while the rest wait;
    past a deadline (`demo --budget`) its later turns would never start and the whole conversation is lost. Started
    first, conversations end while single-turn rows still fill the other slots, and the rows in flight at a
    deadline are single turns, which end and are kept."""
    planned: list[tuple[int, int, int, Conversation, list[int] | None]] = []
    max_prompt = max_length - config.max_new_tokens
    for order, row in enumerate(rows):
        conversation = plan_conversation(row, regenerate=config.regenerate and
                                         not keeps_answers(row.id, config.keep_answers))
        slot = conversation.next_slot()
        if slot is None:  # every answer given and kept (regenerate=false): nothing to write
            if row.id not in done:
                planned.append((0, 0, order, conversation, None))
            continue
        prompt = render_prompt(target.tokenizer, conversation.messages[:slot], chat=config.chat)
        if len(prompt) > max_prompt:
            if config.long_prompts == "skip":
                counts.skipped_long_prompts += 1
                continue
            prompt = fit_prompt(target.tokenizer, conversation.messages[:slot], chat=config.chat,
                                max_tokens=max_prompt)
            if prompt is None:
                counts.skipped_long_prompts += 1
                continue
            counts.truncated_prompts += 1
        if row.id not in done:
            planned.append((conversation.turns_left(), len(prompt), order, conversation, prompt))
    planned.sort(key=lambda item: (-item[0], -item[1], item[2]))  # then longest first: memory trouble shows at once
    return [_Planned(conversation=p[3], first_prompt=p[4]) for p in planned]


def _fingerprint(target: Target, config: DataBuildConfig, rows: list[PromptRow], max_length: int) -> dict:
    settings = {k: v for k, v in asdict(config).items() if k not in _NOT_GENERATION and k != "target"}
    settings["dtype"] = config.target.dtype  # the target's compute dtype changes what it writes; its device does not
    settings["max_length"] = max_length
    rows_sha = hashlib.sha256(json.dumps([[r.id, r.domain, r.messages] for r in rows]).encode()).hexdigest()[:16]
    return {"settings": settings, "target_config_hash": target.config_hash,
            "tokenizer_hash": target.tokenizer_hash, "prompts_sha256": rows_sha}


def _generation_view(fingerprint: dict) -> dict:
    """What must match for finished rows to be reused: the fingerprint without the prompt set."""
    settings = {k: v for k, v in fingerprint.get("settings", {}).items() if k not in _PROMPT_SET}
    return {**{k: v for k, v in fingerprint.items() if k != "prompts_sha256"}, "settings": settings}


def _non_assistant(messages: list[dict]) -> list[dict]:
    return [m for m in messages if m.get("role") != "assistant"]


def _reusable(records: dict[str, dict], rows: list[PromptRow]) -> dict[str, dict]:
    """The finished records that still answer a row of this build: same id, domain and non-assistant turns."""
    by_id = {r.id: r for r in rows}
    return {i: rec for i, rec in records.items() if i in by_id and rec.get("domain") == by_id[i].domain
            and _non_assistant(rec.get("messages", [])) == _non_assistant(by_id[i].messages)}


def _open_work(work: Path, fingerprint: dict) -> None:
    state = work / "state.json"
    if state.is_file():
        old = json.loads(state.read_text())
        if old == fingerprint:
            return
        if _generation_view(old) == _generation_view(fingerprint):  # only the prompt set changed
            write_text_atomic(state, json.dumps(fingerprint, indent=1))
            return
        old, new = _generation_view(old), _generation_view(fingerprint)
        changed = [k for k in new if old.get(k) != new[k]]
        if "settings" in changed:
            changed += [f"data.{k}" for k in new["settings"] if old.get("settings", {}).get(k) != new["settings"][k]]
        raise DraftsmithError(f"{work} holds a build made with other inputs (changed: {', '.join(changed)}); "
                              f"use another --out, or delete {work} to start over")
    work.mkdir(parents=True, exist_ok=True)
    write_text_atomic(state, json.dumps(fingerprint, indent=1))


def read_parts(work: Path) -> dict[str, dict]:
    """Every finished row of earlier runs, by id (parts are written whole, so each one is complete)."""
    records: dict[str, dict] = {}
    for path in sorted(work.glob("part-*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                record = json.loads(line)
                records[record["id"]] = record
    return records


def _next_part(work: Path) -> int:
    indices = [int(p.stem.split("-")[1]) for p in work.glob("part-*.jsonl")]
    return max(indices, default=-1) + 1


def _seed(config: DataBuildConfig, row_id: str, slot: int) -> int:
    """The sampling seed of one answer: from the row and the turn, so any schedule draws the same tokens."""
    return zlib.crc32(f"{config.seed}:{row_id}:{slot}".encode())


def _next_request(target: Target, state: _InFlight, config: DataBuildConfig, max_length: int,
                  prompt: list[int] | None = None) -> Request | None:
    """The request for the conversation's next empty slot; None when it is complete (or the turn no longer fits)."""
    conversation = state.conversation
    slot = conversation.next_slot()
    if slot is None:
        return None
    if prompt is None:
        prompt = render_prompt(target.tokenizer, conversation.messages[:slot], chat=config.chat)
    if len(prompt) > max_length - config.max_new_tokens:  # a later turn no longer fits: the conversation ends
        state.dropped += conversation.drop_from(slot - 1)
        return None
    return Request(key=(conversation.id, slot), prompt=prompt, seed=_seed(config, conversation.id, slot))


def _answered(target: Target, state: _InFlight, slot: int, answer: Answer) -> int:
    """Write an answer into its slot; returns its token count."""
    # Kept as text for the conversation (later turns are prompted with it); the last answer's exact ids are
    # kept too (see row_tokens).
    state.conversation.messages[slot]["content"] = target.tokenizer.decode(answer.token_ids, skip_special_tokens=True)
    state.finished = answer.finished
    state.last_turn = {"index": slot, "token_ids": answer.token_ids}
    if not answer.finished:
        state.unfinished.append(slot)
    return len(answer.token_ids)


def _record(state: _InFlight) -> dict:
    c = state.conversation
    return {"id": c.id, "domain": c.domain, "messages": c.messages, "finished": state.finished,
            "unfinished_turns": [i for i in state.unfinished if i < len(c.messages)],
            "last_turn": state.last_turn, "dropped_turns": state.dropped}


def unmask_cut_endings(input_ids: list[int], loss_mask: list[int], messages: list[dict],
                       unfinished_turns: Sequence[int], *, eos_token_ids: Sequence[int]) -> None:
    """Take the end-of-turn token out of the loss for answers cut at max_new_tokens (in place).

    The template closes every turn, but where an answer was cut the target would have gone on writing:
    the drafter must not learn to predict EOS there. Each assistant turn is one run of 1s in the mask.
    """
    if not unfinished_turns:
        return
    runs, start = [], None
    for k, m in enumerate(loss_mask + [0]):
        if m and start is None:
            start = k
        elif not m and start is not None:
            runs.append((start, k))
            start = None
    assistant = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    if len(runs) != len(assistant):
        return  # a truncated row (max_length) or an empty turn: the runs cannot be matched to turns
    eos = set(eos_token_ids)
    for (run_start, run_end), index in zip(runs, assistant):
        if index in unfinished_turns and input_ids[run_end - 1] in eos:
            loss_mask[run_end - 1] = 0


def row_tokens(tokenizer: Any, record: dict, *, chat: bool, eos_token_ids: Sequence[int]) -> tuple[list[int], list[int]]:
    """(input_ids, loss_mask) of a finished conversation.

    The conversation is rendered with its template and mask; then, where the prompt of the last answer is
    a prefix of that rendering (the usual case), the last answer is replaced by the exact ids the target
    wrote: decoding and re-tokenizing can change them (an answer cut inside a multi-byte character, a
    non-canonical split), and the drafter must learn the target's own tokens. An answer cut at
    max_new_tokens keeps no end-of-turn token in the loss.
    """
    messages = record["messages"]
    input_ids, loss_mask = render_with_mask(tokenizer, messages, chat=chat, eos_token_ids=eos_token_ids)
    unmask_cut_endings(input_ids, loss_mask, messages, record["unfinished_turns"], eos_token_ids=eos_token_ids)
    last = record.get("last_turn")
    if last and last["index"] == len(messages) - 1:
        prompt = render_prompt(tokenizer, messages[:-1], chat=chat)
        if input_ids[: len(prompt)] == prompt:
            answer = list(last["token_ids"])
            return prompt + answer, loss_mask[: len(prompt)] + [1] * len(answer)
    return input_ids, loss_mask


def build_dataset(target: Target | str | Path, config: DataBuildConfig, *, out_dir: str | Path, progress: bool = True,
                  log: Callable[[str], None] = print,
                  on_batch: Callable[[int], None] | None = None, deadline: float | None = None,
                  overwrite: bool = False, capture: CaptureConfig | None = None,
                  cache_dir: str | Path | None = None) -> BuildResult:
    """Self-distil `config.prompts` with `target` (a serve.core.target.Target or a spec for load_target) into out_dir.

    on_batch(part) runs after each batch is saved as .work/part-<part>.jsonl (tests use it to interrupt a build).
    deadline: a time.monotonic() value (`demo --budget`): past it no new conversation starts, the ones in flight end
    their turn, and the dataset holds the rows answered so far (a rerun without it answers the others).
    overwrite: replace a dataset in out_dir whose rows no .work keeps (data/out_folder.py).
    cache_dir: also write the hidden-state cache of offline training there (`--capture`, settings from `capture`),
    from the states the generating forwards compute (data/capture_live.py): no second pass over the data.
    """
    validate(config)
    rows = gather_prompts(config)  # bad prompt files fail before the model loads
    for folder in config.traffic:
        read_manifest(folder)  # not a traffic folder: refused before any work
    out = Path(out_dir)
    replaced = check_out(out, overwrite=overwrite)
    if replaced:
        log(f"data build: {out} holds {replaced}; --overwrite replaces it once this build is saved")
    if isinstance(target, (str, Path)):
        # a server generates: the tokenizer and config suffice (and the weights only to capture)
        target = load_configured(replace(config.target, spec=str(target)), require_chat_template=config.chat,
                                 weights=not config.server.url or cache_dir is not None)
    elif config.chat and not getattr(target.tokenizer, "chat_template", None):
        raise DraftsmithError(f"target {target.name!r} has no chat template; set data.chat=false to build plain "
                              f"prompt + completion data for a base model")
    context = context_length(target)
    max_length = min(config.max_length, context) if context else config.max_length
    if max_length <= config.max_new_tokens:
        raise DraftsmithError(f"the target's context ({context}) leaves no room for prompts with "
                              f"data.max_new_tokens={config.max_new_tokens}")
    live = None
    if cache_dir is not None:
        from draftsmith.data.capture_live import plan_live_capture

        live = plan_live_capture(target, capture or CaptureConfig(), cache_dir, dataset=out)
    counts = _Counts(prompts=len(rows))
    work = out / WORK
    _open_work(work, _fingerprint(target, config, rows, max_length))
    records = _reusable(read_parts(work), rows)
    planned = _plan_rows(target, rows, config, max_length, counts, set(records))
    log(f"data build: {len(rows)} prompts from {', '.join(config.prompts)} -> {out}: {len(records)} answered "
        f"by an earlier run, {len(planned)} to generate, {config.batch_size} at a time (max_new_tokens "
        f"{config.max_new_tokens}, temperature {config.temperature}); skipped {counts.skipped_long_prompts} and "
        f"truncated {counts.truncated_prompts} prompts longer than {max_length - config.max_new_tokens} tokens")
    reused = {"reused_rows": len(records), "reused_batches": len(list(work.glob("part-*.jsonl")))}
    stats = _run_rows(target, planned, config, max_length, work, records, progress, on_batch, log, deadline, live)
    stats.update(reused)
    result = _write_dataset(target, config, rows, records, counts, out, max_length, stats, log)
    log(f"data build: {result.rows} rows, {result.tokens} tokens ({result.loss_tokens} in the loss), "
        f"{result.generated_batches} batches generated at {result.tokens_per_second:.1f} tok/s, "
        f"{result.reused_rows} rows reused -> {out}")
    if live is not None:
        from draftsmith.data.capture_live import finish_live_capture

        result.capture = finish_live_capture(target, out, live, progress=progress, log=log)
    return result


def _batcher(target: Target, config: DataBuildConfig, stats: dict, log: Callable[[str], None],
             live: LiveCapture | None = None):
    """What writes the answers: the target in process (continuous batching, recording the states `live` asks
    for), or the server of data.server."""
    if not config.server.url:
        stats["engine"] = {"kind": "in-process"}
        return ContinuousBatcher(target, slots=config.batch_size, max_new_tokens=config.max_new_tokens,
                                 temperature=config.temperature, top_k=config.top_k, top_p=config.top_p,
                                 record=None if live is None else live.recording)
    if live is not None:
        log("data build: a server's answers carry no hidden states: the cache forwards every row once the "
            "dataset is saved")
    from draftsmith.data.endpoint import Endpoint, EndpointBatcher, check_identity

    endpoint = Endpoint(config.server)
    model = check_identity(endpoint, target)
    log(f"data build: answers from {endpoint.url} ({model}, token ids checked), {config.server.concurrency} "
        f"requests in flight")
    stats["engine"] = {"kind": "server", "url": endpoint.url, "model": model,
                       "concurrency": config.server.concurrency, "endpoint": endpoint}
    return EndpointBatcher(endpoint, model=model, concurrency=config.server.concurrency,
                           max_new_tokens=config.max_new_tokens, eos_token_ids=target.eos_token_ids,
                           temperature=config.temperature, top_k=config.top_k, top_p=config.top_p)


def _run_rows(target: Target, planned: list[_Planned], config: DataBuildConfig, max_length: int, work: Path,
              records: dict[str, dict], progress: bool, on_batch, log: Callable[[str], None],
              deadline: float | None = None, live: LiveCapture | None = None) -> dict:
    """Answer every planned row, data.batch_size rows decoding at a time (or data.server.concurrency requests in
    flight); every batch_size finished rows are saved as their own part file at once (the resume point), after
    the states file of their recorded states (`live`, data/recorded.py). Fills `records`."""
    from tqdm.auto import tqdm

    engine = {"kind": "server", "url": config.server.url} if config.server.url else {"kind": "in-process"}
    stats: dict[str, Any] = {"generated_tokens": 0, "seconds": 0.0, "generated_batches": 0, "engine": engine}
    if not planned:
        return stats
    bar = tqdm(total=len(records) + len(planned), initial=len(records), unit="row", desc="self-distillation",
               disable=not progress, dynamic_ncols=True)
    part = _next_part(work)
    ready: list[dict] = []
    latest: dict[str, tuple[list[int], Any]] = {}  # conversation id -> its latest turn's tokens and recorded states

    def save() -> None:
        nonlocal part
        path = work / f"part-{part:05d}.jsonl"
        if live is not None:  # written first: a part without its states file has its rows forwarded by the capture
            from draftsmith.data.recorded import states_path, write_states

            kept = [(r["id"], *latest.pop(r["id"])) for r in ready if latest.get(r["id"], (0, None))[1] is not None]
            if kept:
                write_states(states_path(path), kept, live.origin)
        write_text_atomic(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in ready))
        for record in ready:
            records[record["id"]] = record
        bar.update(len(ready))
        bar.set_postfix(tok_s=f"{stats['generated_tokens'] / max(stats['seconds'], 1e-9):.1f}")
        ready.clear()
        stats["generated_batches"] += 1
        if on_batch is not None:
            on_batch(part)
        part += 1

    def finish(state: _InFlight) -> None:
        ready.append(_record(state))
        if len(ready) == config.batch_size:
            save()

    batcher = _batcher(target, config, stats, log, live)
    states = {item.conversation.id: _InFlight(item.conversation) for item in planned}
    for item in planned:
        state = states[item.conversation.id]
        request = None if item.first_prompt is None else _next_request(target, state, config, max_length,
                                                                         item.first_prompt)
        if request is None:  # nothing to write (every answer given and kept)
            finish(state)
        else:
            batcher.add(request)
    late = False
    while batcher.busy:
        if not late and deadline is not None and time.monotonic() > deadline:
            late = True
            stats["unstarted_rows"] = len(batcher.queue)
            batcher.queue.clear()
            log(f"data build: the time given is up: {stats['unstarted_rows']} rows not started, "
                f"{batcher.running} in flight end their turn")
        start = time.perf_counter()
        complete = []
        for request, answer in batcher.step():
            state = states[request.key[0]]
            stats["generated_tokens"] += _answered(target, state, request.key[1], answer)
            if live is not None:  # the row's states are its last turn's: prompt + answer
                latest[state.conversation.id] = (list(request.prompt) + list(answer.token_ids), answer.recorded)
            if late:  # a conversation with turns left is not saved: a rerun answers it whole
                if state.conversation.next_slot() is None:
                    complete.append(state)
                continue
            follow_up = _next_request(target, state, config, max_length)
            if follow_up is None:
                complete.append(state)
            else:
                batcher.add(follow_up, first=True)  # the conversation goes on before new rows start
        stats["seconds"] += time.perf_counter() - start
        for state in complete:
            finish(state)
    if ready:
        save()
    bar.close()
    endpoint = stats["engine"].pop("endpoint", None)
    if endpoint is not None:
        stats["engine"]["retried_requests"] = endpoint.retried
        endpoint.close()
    return stats


def _add_traffic(columns: dict[str, list], target: Target, config: DataBuildConfig, counts: _Counts, max_length: int) -> None:
    """Rows of data.traffic folders (`serve --record`), as served: the target's own answers, not regenerated."""
    for folder in config.traffic:
        served = traffic_rows(folder, tokenizer_hash=target.tokenizer_hash)
        for name in columns:
            for value in served[name]:
                columns[name].append(value[:max_length] if name in ("input_ids", "loss_mask") else value)
        counts.traffic_rows += len(served["id"])
        counts.truncated_rows += sum(len(ids) > max_length for ids in served["input_ids"])


def _write_dataset(target: Target, config: DataBuildConfig, rows: list[PromptRow], records: dict[str, dict],
                   counts: _Counts, out: Path, max_length: int, stats: dict,
                   log: Callable[[str], None]) -> BuildResult:
    import datasets

    from draftsmith.serve.core.config import save_config, to_dict

    columns: dict[str, list] = {"id": [], "domain": [], "input_ids": [], "loss_mask": []}
    for row in rows:  # the prompts' own order, not the batches'
        record = records.get(row.id)
        if record is None:  # skipped as too long
            continue
        counts.unfinished_answers += len(record["unfinished_turns"])
        counts.dropped_turns += record["dropped_turns"]
        if config.drop_unfinished and not record["finished"]:
            counts.dropped_unfinished_rows += 1
            continue
        input_ids, loss_mask = row_tokens(target.tokenizer, record, chat=config.chat,
                                          eos_token_ids=target.eos_token_ids)
        if len(input_ids) > max_length:
            input_ids, loss_mask = input_ids[:max_length], loss_mask[:max_length]
            counts.truncated_rows += 1
        if not any(loss_mask):
            counts.empty_rows += 1
            continue
        columns["id"].append(record["id"])
        columns["domain"].append(record["domain"])
        columns["input_ids"].append(input_ids)
        columns["loss_mask"].append(loss_mask)
    _add_traffic(columns, target, config, counts, max_length)
    if not columns["id"]:
        raise DraftsmithError(f"no rows left to write ({counts.prompts} prompts, {counts.skipped_long_prompts} "
                              f"skipped as too long, {counts.empty_rows} without assistant tokens)")
    features = datasets.Features({"id": datasets.Value("string"), "domain": datasets.Value("string"),
                                  "input_ids": datasets.Sequence(datasets.Value("int32")),
                                  "loss_mask": datasets.Sequence(datasets.Value("int8"))})
    dataset = datasets.Dataset.from_dict(columns, features=features)
    domains: dict[str, int] = {}
    for domain in columns["domain"]:
        domains[domain] = domains.get(domain, 0) + 1
    count_dict = asdict(counts)
    result = BuildResult(out_dir=out, rows=len(dataset), tokens=sum(map(len, columns["input_ids"])),
                         loss_tokens=sum(map(sum, columns["loss_mask"])), counts=count_dict, domains=domains,
                         generated_tokens=stats["generated_tokens"], generation_seconds=stats["seconds"],
                         generated_batches=stats["generated_batches"], reused_batches=stats["reused_batches"],
                         reused_rows=stats["reused_rows"])
    if config.draft_vocab_size:
        # A figure for choosing model.draft_vocab_size; training picks the vocabulary itself, from its training
        # rows only (train/run.py), so nothing is written here.
        from draftsmith.data.vocab import select_draft_vocab
        from draftsmith.serve.core.target import text_config

        vocab_size = text_config(target.config).vocab_size
        _, _, result.draft_vocab_coverage = select_draft_vocab(dataset, vocab_size, config.draft_vocab_size)
    # what `train` and `data capture` compare their target with (data/made_for.py)
    info = {"target": {**TargetRecord.of(target).to_json(), "path": str(target.path)},
            "data_config_hash": hashlib.sha256(json.dumps(to_dict(config), sort_keys=True).encode()).hexdigest()[:16],
            "prompts": list(config.prompts), "max_length": max_length, "rows": result.rows, "tokens": result.tokens,
            "loss_tokens": result.loss_tokens, "domains": domains, "counts": count_dict,
            "generation": {"engine": stats["engine"],
                           "sampling": {"temperature": config.temperature, "top_k": config.top_k,
                                        "top_p": config.top_p, "seed": config.seed,
                                        "max_new_tokens": config.max_new_tokens},
                           "tokens": result.generated_tokens, "seconds": round(result.generation_seconds, 3),
                           "tokens_per_second": round(result.tokens_per_second, 2),
                           "generated_batches": result.generated_batches, "reused_batches": result.reused_batches,
                           "reused_rows": result.reused_rows},
            "draft_vocab_coverage": result.draft_vocab_coverage}
    _log_replaced(out, info, log)
    real = out.resolve()  # an --out that is a link keeps pointing at the folder, which is the one replaced
    with whole_folder(real, replace=True) as folder:  # the earlier dataset stays whole until this one is
        dataset.save_to_disk(str(folder))
        save_config(config, folder)
        write_text_atomic(folder / BUILD_INFO, json.dumps(info, indent=1))
        carry_over(real, folder)
    return result


def _log_replaced(out: Path, info: dict, log: Callable[[str], None]) -> None:
    """Say so when the dataset this build replaces was made from other prompts (its rows stay in .work)."""
    try:
        earlier = json.loads((out / BUILD_INFO).read_text())
    except (OSError, ValueError):
        return
    if isinstance(earlier, dict) and earlier.get("prompts") != info["prompts"]:
        log(f"data build: replacing the dataset of {earlier.get('rows')} rows from {earlier.get('prompts')} in "
            f"{out} (its answered rows stay in {out / WORK}: a build of those prompts reuses them)")
