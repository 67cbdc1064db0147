"""Bounded load test of `draftsmith serve` from a second process, on loopback only.

    python -m draftsmith.bench.loadtest --url http://127.0.0.1:8000 --clients 4 --requests 40 --max-tokens 64
    python -m draftsmith.bench.loadtest --compare --target demo --drafter ngram --k 5 --json loadtest.json
    python -m draftsmith.bench.loadtest --compare --clients 1,4,16 --max-batch 1,8 --requests 48 --json sweep.json

`--compare` starts two servers per `--max-batch` value in this run, one with speculation and one without (plain
decoding), and sends them all the same requests, alternating between them in blocks (`--rounds`): throughput,
p50/p99 request latency, time to first token and per-token latency (client-side, from streamed chunks), μ,
failed requests, and each server's resident memory (from its /metrics) after a warm-up and after the load.
`--max-batch 1` is a server that decodes one request at a time (the baseline continuous batching is measured
against). `--clients 1,4,16` repeats the load at each number of concurrent clients and ends with a table of
throughput and latency per client count, speculation on against off. At temperature 0 every server must return
the first one's text (the decoder is lossless, batched or not); mismatches are counted.

The built-in prompts are code edits and repetitions (where prompt lookup helps) plus a few free
questions. Stdlib only: the client is http.client with server-sent events read line by line.
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from draftsmith.serve.server.bind import free_port

LOOPBACK = {"127.0.0.1", "localhost", "::1"}
MAX_REQUESTS = 2000  # hard bound on one run

_SNIPPETS = [
    ("def total(xs):\n    s = 0\n    for x in xs:\n        s = s + x\n    return s\n",
     "Rename the variable `s` to `acc`"),
    ("def is_even(n):\n    if n % 2 == 0:\n        return True\n    else:\n        return False\n",
     "Add a docstring to the function"),
    ("class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n\n    def norm(self):\n"
     "        return (self.x ** 2 + self.y ** 2) ** 0.5\n", "Add type hints to every method"),
    ("for i in range(10):\n    if i % 3 == 0:\n        print(i, 'fizz')\n    else:\n        print(i)\n",
     "Change the loop to run up to 20"),
    ("def greet(name):\n    message = 'Hello, ' + name + '!'\n    print(message)\n    return message\n",
     "Use an f-string instead of string concatenation"),
    ("import os\n\ndef list_files(path):\n    files = []\n    for name in os.listdir(path):\n"
     "        files.append(name)\n    return files\n", "Sort the returned list"),
    ("def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n",
     "Rename the function to `fibonacci`"),
    ("SELECT name, age FROM users WHERE age > 30 ORDER BY name;", "Change the age limit to 40"),
]
_FREE = ["Write a short poem about autumn leaves.", "Explain what a hash table is in two sentences.",
         "Give three tips for sleeping better."]


def builtin_prompts() -> list[dict]:
    """Chat requests: code edits whose answers repeat the code, a list to repeat, free questions."""
    rows = [{"messages": [{"role": "user", "content": f"{task}. Reply with the complete updated code only.\n\n"
                           f"```\n{code}```"}], "domain": "code-edit"} for code, task in _SNIPPETS]
    rows.append({"messages": [{"role": "user", "content": "Repeat this list exactly, one item per line: apple, "
                               "banana, cherry, date, elderberry, fig, grape, apple, banana, cherry."}],
                 "domain": "repeat"})
    rows += [{"messages": [{"role": "user", "content": q}], "domain": "free"} for q in _FREE]
    return rows


def load_prompts(path: str | None) -> list[dict]:
    if path is None:
        return builtin_prompts()
    rows = []
    for line in Path(path).read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            if "messages" in row:
                rows.append({"messages": row["messages"], "domain": row.get("domain", "default")})
            elif "prompt" in row:
                rows.append({"messages": [{"role": "user", "content": row["prompt"]}],
                             "domain": row.get("domain", "default")})
            else:
                raise SystemExit(f"{path}: each row needs `messages` or `prompt`")
    if not rows:
        raise SystemExit(f"{path}: no prompts")
    return rows


@dataclass
class Outcome:
    index: int
    ok: bool
    error: str = ""
    ttft: float | None = None  # seconds, send -> first generated text
    tpot: float | None = None  # seconds per token after the first
    seconds: float = 0.0
    completion_tokens: int = 0
    mu: float | None = None
    text: str = ""


def _loopback(url: str) -> tuple[str, int]:
    parsed = urlparse(url)
    if parsed.scheme != "http" or parsed.hostname not in LOOPBACK:
        raise SystemExit(f"--url must be http on loopback (127.0.0.1, localhost, ::1), got {url!r}")
    return parsed.hostname, parsed.port or 80


def stream_chat(host: str, port: int, body: dict, *, timeout: float) -> Outcome:
    """One streamed chat request; timings from the arrival of server-sent chunks."""
    out = Outcome(index=-1, ok=False)
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    t0 = time.perf_counter()
    first = last = None
    parts: list[str] = []
    try:
        conn.request("POST", "/v1/chat/completions", body=json.dumps(body),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            out.error = f"HTTP {resp.status}: {resp.read()[:200]!r}"
            return out
        done = False
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                break
            chunk = json.loads(line[6:])
            if "error" in chunk:
                out.error = chunk["error"]["message"]
                return out
            for choice in chunk.get("choices", []):
                text = choice.get("delta", {}).get("content")
                if text:
                    now = time.perf_counter()
                    first = first if first is not None else now
                    last = now
                    parts.append(text)
            if chunk.get("usage"):
                out.completion_tokens = chunk["usage"]["completion_tokens"]
                out.mu = chunk["usage"].get("mu")
        if not done:
            out.error = "stream ended without [DONE]"
            return out
    except (OSError, http.client.HTTPException, ValueError) as err:
        out.error = f"{type(err).__name__}: {err}"
        return out
    finally:
        conn.close()
    out.seconds = time.perf_counter() - t0
    out.text = "".join(parts)
    out.ttft = None if first is None else first - t0
    if first is not None and out.completion_tokens > 1:
        out.tpot = (last - first) / (out.completion_tokens - 1)
    out.ok = True
    return out


def get_json(host: str, port: int, path: str, timeout: float = 10) -> tuple[int, str]:
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


def server_rss_mib(host: str, port: int) -> float | None:
    """The server's own process_resident_memory_bytes from /metrics (prometheus_client, Linux)."""
    status, text = get_json(host, port, "/metrics")
    for line in text.splitlines():
        if line.startswith("process_resident_memory_bytes "):
            return float(line.split()[1]) / 2**20
    return None


def model_name(host: str, port: int) -> str:
    status, text = get_json(host, port, "/v1/models")
    return json.loads(text)["data"][0]["id"]


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in 0..100) of a non-empty list."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass
class PhaseResult:
    label: str
    clients: int
    requests: int
    failed: int
    seconds: float
    completion_tokens: int
    tokens_per_second: float
    requests_per_second: float
    latency_p50: float | None  # seconds, send -> end of the stream
    latency_p99: float | None
    ttft_p50: float | None
    ttft_p99: float | None
    tpot_p50: float | None
    tpot_p99: float | None
    mean_mu: float | None
    rss_mib_before: float | None
    rss_mib_after: float | None
    errors: list[str] = field(default_factory=list)


def _body(name: str, prompts: list[dict], i: int, max_tokens: int, temperature: float) -> dict:
    return {"model": name, "messages": prompts[i % len(prompts)]["messages"], "max_tokens": max_tokens,
            "temperature": temperature, "seed": i, "stream": True, "stream_options": {"include_usage": True}}


class ServerUnderTest:
    """A server under test: where it is, what it calls its model, what its load produced so far."""

    def __init__(self, url: str, label: str, *, clients: int = 1):
        self.host, self.port = _loopback(url)
        self.label = label
        self.clients = clients
        self.name = model_name(self.host, self.port)
        self.outcomes: list[Outcome] = []
        self.seconds = 0.0
        self.rss_before: float | None = None
        self.rss_after: float | None = None

    def warm_up(self, prompts: list[dict], n: int, *, timeout: float) -> None:
        # First forwards pay one-off costs (allocator growth, lazy init); keep them out of the figures.
        for i in range(n):
            stream_chat(self.host, self.port, _body(self.name, prompts, i, 8, 0.0), timeout=timeout)
        self.rss_before = server_rss_mib(self.host, self.port)

    def run_block(self, prompts: list[dict], indices: list[int], *, clients: int, max_tokens: int,
                  temperature: float, timeout: float, stop_at: float) -> None:
        """Send requests `indices` from `clients` concurrent connections; nothing starts after `stop_at`."""
        todo: queue.Queue[int] = queue.Queue()
        for i in indices:
            todo.put(i)
        lock = threading.Lock()

        def client() -> None:
            while time.perf_counter() < stop_at:
                try:
                    i = todo.get_nowait()
                except queue.Empty:
                    return
                out = stream_chat(self.host, self.port, _body(self.name, prompts, i, max_tokens, temperature),
                                  timeout=timeout)
                out.index = i
                with lock:
                    self.outcomes.append(out)

        t0 = time.perf_counter()
        threads = [threading.Thread(target=client, daemon=True) for _ in range(min(clients, len(indices)))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.seconds += time.perf_counter() - t0

    def summary(self, requests: int, deadline: float) -> PhaseResult:
        self.rss_after = server_rss_mib(self.host, self.port)
        outcomes = self.outcomes
        not_sent = requests - len(outcomes)
        ok = [o for o in outcomes if o.ok]
        tokens = sum(o.completion_tokens for o in ok)
        latencies = [o.seconds for o in ok]
        ttfts = [o.ttft for o in ok if o.ttft is not None]
        tpots = [o.tpot for o in ok if o.tpot is not None]
        mus = [o.mu for o in ok if o.mu is not None]
        errors = [f"#{o.index}: {o.error}" for o in outcomes if not o.ok] + (
            [f"{not_sent} requests not sent before the {deadline:.0f} s deadline"] if not_sent else [])
        seconds = max(self.seconds, 1e-9)
        return PhaseResult(
            label=self.label, clients=self.clients, requests=requests, failed=requests - len(ok),
            seconds=round(seconds, 3), completion_tokens=tokens, tokens_per_second=round(tokens / seconds, 3),
            requests_per_second=round(len(ok) / seconds, 4),
            latency_p50=percentile(latencies, 50), latency_p99=percentile(latencies, 99),
            ttft_p50=percentile(ttfts, 50), ttft_p99=percentile(ttfts, 99),
            tpot_p50=percentile(tpots, 50), tpot_p99=percentile(tpots, 99),
            mean_mu=round(statistics.fmean(mus), 4) if mus else None,
            rss_mib_before=self.rss_before, rss_mib_after=self.rss_after, errors=errors[:20])

    def texts(self) -> dict[int, str]:
        return {o.index: o.text for o in self.outcomes if o.ok}


def run_load(urls: dict[str, str], prompts: list[dict], *, clients: int, requests: int, max_tokens: int,
             temperature: float, timeout: float, deadline: float, rounds: int = 1,
             warmup: int = 2) -> list[ServerUnderTest]:
    """The same `requests` against every server in `urls` (label -> url), split into `rounds` blocks
    that alternate between servers (order flipped each round), so slow drifts of a shared machine
    hit all of them alike. Each server's time is the sum of its blocks."""
    targets = [ServerUnderTest(url, label, clients=clients) for label, url in urls.items()]
    for t in targets:
        t.warm_up(prompts, warmup, timeout=timeout)
    blocks = [list(range(requests))[r::rounds] for r in range(rounds)]
    stop_at = time.perf_counter() + deadline * len(targets)
    for r, indices in enumerate(blocks):
        for t in (targets if r % 2 == 0 else targets[::-1]):
            t.run_block(prompts, indices, clients=clients, max_tokens=max_tokens, temperature=temperature,
                        timeout=timeout, stop_at=stop_at)
            print(f"[{t.label}] round {r + 1}/{rounds}: {len(t.outcomes)} requests done, {t.seconds:.1f} s",
                  file=sys.stderr, flush=True)
    return targets


# ---- starting servers for --compare ------------------------------------------------------------------
class ServerProcess:
    """`draftsmith serve` in a child process on a free loopback port, stopped by its pid on exit."""

    def __init__(self, flags: list[str], overrides: list[str], log_path: Path, *, root: Path | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.log = open(log_path, "w")
        cmd = [sys.executable, "-m", "draftsmith.cli", "serve", "--host", "127.0.0.1", "--port", str(self.port),
               "--served-model-name", "loadtest", *flags, *overrides, "log_level=warning"]
        env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
        # root: the checkout whose code serves (another one's, to compare versions); default this one
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                     cwd=root or Path(__file__).resolve().parents[2])

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"server exited with {self.proc.returncode}; log {self.log_path}:\n"
                                 f"{self.log_path.read_text()[-2000:]}")
            try:
                if get_json("127.0.0.1", self.port, "/health", timeout=2)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.5)
        raise SystemExit(f"server not ready after {timeout:.0f} s; log {self.log_path}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()


def _fmt(value: float | None, scale: float = 1000, unit: str = "ms") -> str:
    return "-" if value is None else f"{value * scale:.0f} {unit}"


def print_table(results: list[PhaseResult]) -> None:
    rows = [("phase", lambda r: r.label), ("clients", lambda r: str(r.clients)),
            ("requests (failed)", lambda r: f"{r.requests} ({r.failed})"),
            ("wall time", lambda r: f"{r.seconds:.1f} s"),
            ("throughput", lambda r: f"{r.tokens_per_second:.2f} tok/s, {r.requests_per_second:.3f} req/s"),
            ("completion tokens", lambda r: str(r.completion_tokens)),
            ("latency p50 / p99", lambda r: f"{_fmt(r.latency_p50)} / {_fmt(r.latency_p99)}"),
            ("TTFT p50 / p99", lambda r: f"{_fmt(r.ttft_p50)} / {_fmt(r.ttft_p99)}"),
            ("per-token p50 / p99", lambda r: f"{_fmt(r.tpot_p50)} / {_fmt(r.tpot_p99)}"),
            ("mean mu", lambda r: "-" if r.mean_mu is None else f"{r.mean_mu:.2f}"),
            ("server RSS before -> after", lambda r: f"{_fmt(r.rss_mib_before, 1, 'MiB')} -> "
                                                     f"{_fmt(r.rss_mib_after, 1, 'MiB')}")]
    width = max(len(name) for name, _ in rows)
    for name, get in rows:
        print(f"{name:<{width}}  " + "  |  ".join(f"{get(r):<34}" for r in results))
    for r in results:
        for err in r.errors:
            print(f"[{r.label}] {err}")


def int_list(text: str) -> list[int]:
    """`4` or `1,4,16` -> [1, 4, 16] (an argparse type)."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        values = []
    if not values:
        raise argparse.ArgumentTypeError(f"expected integers separated by commas (1,4,16), got {text!r}")
    return values


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def print_sweep(sweep: list[dict], labels: list[str]) -> None:
    """One row per client count: each server's throughput and request latency p50 / p99."""
    print("\nthroughput, request latency p50 / p99 (s), per number of concurrent clients")
    cells = [[f"{r['tokens_per_second']:.2f} tok/s, {_seconds(r['latency_p50'])} / {_seconds(r['latency_p99'])}"
              for r in entry["results"]] for entry in sweep]
    width = max(34, *(len(label) for label in labels))
    print(f"{'clients':<8}" + "  |  ".join(f"{label:<{width}}" for label in labels))
    for entry, row in zip(sweep, cells):
        print(f"{entry['clients']:<8}" + "  |  ".join(f"{cell:<{width}}" for cell in row))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a running server (loopback only)")
    parser.add_argument("--compare", action="store_true",
                        help="start a server with and one without speculation (per --max-batch value)")
    parser.add_argument("--target", default="demo")
    parser.add_argument("--drafter", default="ngram")
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--max-batch", type=int_list, default=[8],
                        help="--compare: the servers' --max-batch, or a list (1,8): a pair of servers each; 1 decodes "
                             "one request at a time (default: 8)")
    parser.add_argument("--clients", type=int_list, default=[4],
                        help="concurrent clients, or a list (1,4,16): the load is repeated at each (default: 4)")
    parser.add_argument("--requests", type=int, default=40, help="requests per server at each client count")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--prompts", default=None, help="JSONL with `messages` or `prompt` (default: built-in)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per request")
    parser.add_argument("--deadline", type=float, default=1800,
                        help="seconds of load per server and client count; requests not started by then count as "
                             "failed")
    parser.add_argument("--server-threads", type=int, default=None,
                        help="--compare: torch threads per server (1 is fastest on a busy shared CPU)")
    parser.add_argument("--rounds", type=int, default=4,
                        help="--compare: alternate between the servers in this many blocks of requests")
    parser.add_argument("--startup-timeout", type=float, default=600)
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args(argv)
    if not (1 <= args.requests <= MAX_REQUESTS and all(1 <= c <= 64 for c in args.clients)
            and (args.url or 1 <= args.rounds <= args.requests)):
        parser.error(f"--requests must be in 1..{MAX_REQUESTS}, --clients in 1..64, --rounds in 1..requests")
    if bool(args.url) == args.compare:
        parser.error("give either --url or --compare")
    if min(args.max_batch) < 1:
        parser.error("--max-batch must be >= 1")
    prompts = load_prompts(args.prompts)
    load = dict(requests=args.requests, max_tokens=args.max_tokens, temperature=args.temperature,
                timeout=args.timeout, deadline=args.deadline)
    report: dict = {"settings": {**load, "clients": args.clients, "rounds": args.rounds if args.compare else 1,
                                 "target": args.target, "drafter": args.drafter, "k": args.k,
                                 "max_batch": args.max_batch if args.compare else None,
                                 "server_threads": args.server_threads, "prompts": args.prompts or "built-in",
                                 "cpu_count": os.cpu_count()}}
    servers: dict[str, ServerProcess] = {}
    pairs: dict[int, tuple[str, str]] = {}  # max batch -> (speculative label, plain label)
    if args.url:
        urls, rounds = {args.url: args.url}, 1
    else:
        log_dir = Path(tempfile.mkdtemp(prefix="draftsmith-loadtest-"))
        report["server_logs"] = str(log_dir)
        flags = ["--target", args.target, "--drafter", args.drafter, "--k", str(args.k)]
        overrides = [f"threads={args.server_threads}"] if args.server_threads else []
        for batch in args.max_batch:
            spec = f"speculative ({args.drafter}, k={args.k}), max batch {batch}"
            plain = f"plain (no speculation), max batch {batch}"
            pairs[batch] = (spec, plain)
            servers[spec] = ServerProcess([*flags, "--max-batch", str(batch)], overrides,
                                          log_dir / f"speculative-b{batch}.log")
            servers[plain] = ServerProcess([*flags, "--max-batch", str(batch), "--no-speculation"], overrides,
                                           log_dir / f"plain-b{batch}.log")
        urls, rounds = {label: s.url for label, s in servers.items()}, args.rounds
    sweep: list[dict] = []
    try:
        for server in servers.values():
            server.wait_ready(args.startup_timeout)
        for i, clients in enumerate(args.clients):
            print(f"== {clients} concurrent client(s) ==", file=sys.stderr, flush=True)
            targets = run_load(urls, prompts, clients=clients, rounds=rounds, warmup=2 if i == 0 else 0, **load)
            results = [t.summary(args.requests, args.deadline) for t in targets]
            entry: dict = {"clients": clients, "results": [asdict(r) for r in results]}
            if pairs:
                tps = {r.label: r.tokens_per_second for r in results}
                entry["speedup_tokens_per_second"] = {
                    batch: round(tps[spec] / tps[plain], 3) if tps[plain] else None
                    for batch, (spec, plain) in pairs.items()}
                texts = {t.label: t.texts() for t in targets}
                reference = texts[targets[0].label]  # every server must return the first one's text (temperature 0)
                entry["text_mismatches"] = {label: sum(reference[j] != got[j] for j in set(reference) & set(got))
                                            for label, got in texts.items() if label != targets[0].label}
                entry["compared_outputs"] = {label: len(set(reference) & set(got))
                                             for label, got in texts.items() if label != targets[0].label}
            sweep.append(entry)
            print(f"\n{clients} concurrent client(s)")
            print_table(results)
            for batch, speedup in entry.get("speedup_tokens_per_second", {}).items():
                print(f"max batch {batch}: throughput speedup of speculation "
                      + ("-" if speedup is None else f"{speedup:.2f}x"))
            for label, mismatches in entry.get("text_mismatches", {}).items():
                compared = entry["compared_outputs"][label]
                print(f"identical to {targets[0].label}: {label} {compared - mismatches}/{compared}"
                      + (" (temperature 0)" if args.temperature == 0 else ""))
    finally:
        for server in servers.values():
            server.stop()
    report["runs"] = sweep
    if len(sweep) > 1:
        print_sweep(sweep, list(urls))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 1 if any(r["failed"] for entry in sweep for r in entry["results"]) else 0


if __name__ == "__main__":
    sys.exit(main())
