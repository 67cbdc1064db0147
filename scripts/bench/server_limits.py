"""What one oversized request costs `draftsmith serve` and its other clients: /health latency (p50 / max) while the
request is being answered or refused, and the server's resident memory before and after it.

    python -m draftsmith.bench.server_limits [--target demo] [--compare /work/main] [--chunked-mb 200]

Four requests, each to a fresh `draftsmith serve` (plain decoding, one torch thread, after one short warm-up
request) started from this checkout and, with --compare ROOT, from another checkout's code, side by side:
  maximal body     a prompt that fills the body limit (4 MB of text, sent with its Content-Length)
  maximal ids      a prompt of token ids that fills the body limit (a million ids)
  longest prompt   the longest prompt this checkout still tokenizes (serve.max_prompt_chars, about 660k characters
                   on the default target), which then cannot fit the context
  chunked body     --chunked-mb of prompt sent chunked, without a Content-Length, to a model id nobody serves
While each request is under way, a second client polls /health every 20 ms. Memory is the server's VmRSS before
and after the request, and VmHWM (its peak since it started) after. Loopback only; stdlib client.
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from draftsmith.bench.loadtest import ServerProcess, percentile

MODEL = "loadtest"  # ServerProcess serves under this id
PIECE = 1 << 16  # bytes per chunk of a chunked body


@dataclass
class Outcome:
    label: str
    status: str = "-"
    seconds: float = 0.0
    health: list[float] = field(default_factory=list)
    rss_before: float = 0.0
    rss_after: float = 0.0
    peak_after: float = 0.0

    def cells(self) -> list[str]:
        p50, top = percentile(self.health, 50), max(self.health, default=None)
        ms = lambda v: "-" if v is None else f"{v * 1000:.0f} ms"  # noqa: E731
        return [self.status[:60], f"{self.seconds:.2f} s", f"{ms(p50)} / {ms(top)} (n={len(self.health)})",
                f"{self.rss_before:.0f} -> {self.rss_after:.0f} MiB", f"{self.peak_after:.0f} MiB"]


def memory_mib(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM of a process, in MiB (Linux /proc)."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) / 1024
    return fields


def around_prompt(model: str = MODEL) -> tuple[bytes, bytes]:
    """A completions body without its prompt's text: what comes before and after it."""
    head = json.dumps({"model": model, "max_tokens": 1, "prompt": ""})[:-2].encode()  # ... "prompt": "
    return head, b'"}'


def words(n: int) -> bytes:
    """`n` bytes (and characters) of plain words."""
    return (b"lorem ipsum dolor sit amet " * (n // 27 + 1))[:n]


def chunked(head: bytes, size: int, tail: bytes) -> Iterable[bytes]:
    yield head
    for start in range(0, size, PIECE):
        yield words(min(PIECE, size - start))
    yield tail


def send(port: int, body: bytes | Iterable[bytes], *, timeout: float) -> str:
    """POST /v1/completions; the status and the error message (or a connection error)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        headers = {"Content-Type": "application/json"}
        conn.request("POST", "/v1/completions", body=body, headers=headers, encode_chunked=not isinstance(body, bytes))
        resp = conn.getresponse()
        text = resp.read().decode(errors="replace")
        try:
            message = json.loads(text)["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = text
        return f"{resp.status}: {message[:90]}"
    except OSError as err:
        return f"connection: {type(err).__name__}: {err}"[:100]
    finally:
        conn.close()


def measure(server: ServerProcess, label: str, body: bytes | Iterable[bytes], *, timeout: float) -> Outcome:
    """Send `body` while polling /health; the answer, its time, the /health latencies and the server's memory."""
    out = Outcome(label)
    pid = server.proc.pid
    out.rss_before = memory_mib(pid)["VmRSS"]
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout)
            start = time.perf_counter()
            conn.request("GET", "/health")
            conn.getresponse().read()
            out.health.append(time.perf_counter() - start)
            conn.close()
            time.sleep(0.02)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    t0 = time.perf_counter()
    out.status = send(server.port, body, timeout=timeout)
    out.seconds = time.perf_counter() - t0
    done.set()
    poller.join(timeout)
    time.sleep(0.5)  # let the server finish discarding / freeing
    mem = memory_mib(pid)
    out.rss_after, out.peak_after = mem["VmRSS"], mem["VmHWM"]
    return out


def requests(args) -> dict[str, bytes | Iterable[bytes]]:
    head, tail = around_prompt()
    body_chars = int(args.max_body_mb * (1 << 20)) - len(head) - len(tail) - 16
    nobody_head, nobody_tail = around_prompt("nobody-serves-this")
    ids = json.dumps({"model": MODEL, "max_tokens": 1, "prompt": [11] * (body_chars // 4)}).encode()  # "11, " each
    return {"maximal body": head + words(body_chars) + tail,
            "maximal ids": ids,
            "longest prompt": head + words(args.longest_prompt) + tail,
            "chunked body": chunked(nobody_head, int(args.chunked_mb * (1 << 20)), nobody_tail)}


def run_server(root: Path | None, args, log_dir: Path, name: str) -> list[Outcome]:
    """Each request to a server of its own, so that one's memory does not hide in another's peak."""
    outcomes = []
    for label, body in requests(args).items():
        overrides = ["target.threads=1", f"target.spec={args.target}"]
        server = ServerProcess(["--no-speculation"], overrides, log_dir / f"{name}-{label.replace(' ', '-')}.log",
                               root=root)
        try:
            server.wait_ready(args.startup_timeout)
            warm = send(server.port, json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 2}).encode(),
                        timeout=60)
            assert warm.startswith("200"), warm
            outcomes.append(measure(server, label, body, timeout=args.timeout))
        finally:
            server.stop()
    return outcomes


def longest_prompt(target_spec: str) -> int:
    """This checkout's default serve.max_prompt_chars for the target `target_spec` (the vocabulary's longest entry x the context)."""
    from draftsmith.serve.server.limits import longest_token_chars
    from draftsmith.serve.core.target import load_target, text_config

    loaded = load_target(target_spec, weights=False)
    return longest_token_chars(loaded.tokenizer) * int(text_config(loaded.model.config).max_position_embeddings)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="demo")
    parser.add_argument("--compare", type=Path, default=None, metavar="ROOT",
                        help="also serve from the checkout at ROOT (e.g. the main branch before this change)")
    parser.add_argument("--chunked-mb", type=float, default=200.0)
    parser.add_argument("--max-body-mb", type=float, default=4.0, help="this checkout's serve.max_body_mb")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--startup-timeout", type=float, default=300.0)
    args = parser.parse_args(argv)
    args.longest_prompt = longest_prompt(args.target)
    load = lambda: " ".join(f"{x:.2f}" for x in os.getloadavg())  # noqa: E731
    print(f"load before: {load()}; "
          f"target {args.target}; one torch thread; longest prompt {args.longest_prompt:,} characters", flush=True)
    log_dir = Path(tempfile.mkdtemp(prefix="bench-server-limits-"))
    runs = {"this checkout": run_server(None, args, log_dir, "this")}
    if args.compare is not None:
        runs[f"{args.compare}"] = run_server(args.compare.resolve(), args, log_dir, "compare")
    print(f"load after: {load()}")
    columns = ["request", "server", "answer", "time", "/health p50 / max", "RSS before -> after", "peak RSS"]
    # request by request, the servers side by side
    rows = [[outcome.label, label, *outcome.cells()] for i in range(max(map(len, runs.values())))
            for label, outcomes in runs.items() for outcome in outcomes[i:i + 1]]
    widths = [max(len(str(row[c])) for row in [columns, *rows]) for c in range(len(columns))]
    for row in [columns, *rows]:
        print("  ".join(f"{cell:<{w}}" for cell, w in zip(row, widths)).rstrip())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
