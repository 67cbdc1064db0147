"""`draftsmith serve` in a child process for the benchmarks: started on a free port, waited for, stopped."""
from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import httpx

from draftsmith.serve.server.bind import free_port

ROOT = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def running_server(*serve_args: str, threads: int, start_timeout: float = 600) -> Iterator[str]:
    """Yield the base URL of `draftsmith serve SERVE_ARGS` once /health answers; the server stops on exit."""
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "draftsmith.cli", "serve", *serve_args, "--port", str(port),
                               f"target.threads={threads}"], cwd=ROOT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + start_timeout
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{base}/health", timeout=5).status_code == 200:
                    break
            if server.poll() is not None or time.time() > deadline:
                raise SystemExit(f"the server did not start (exit {server.poll()})")
            time.sleep(2)
        yield base
    finally:
        server.terminate()
        server.wait(timeout=60)
