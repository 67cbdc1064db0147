"""The server's address, taken before the model loads: a port already in use is reported at once, not after
loading a model for minutes (uvicorn binds only when it starts serving)."""
from __future__ import annotations

import errno
import socket

from draftsmith.serve.core.errors import DraftsmithError


class BindError(DraftsmithError):
    """The server cannot listen where it was asked to; says what to do."""


def bind_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to (host, port), as uvicorn binds it (SO_REUSEADDR, IPv6 when the host has a colon).
    It is not listening yet: until the server starts, connections are refused rather than left hanging."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family=family)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart need not wait out TIME_WAIT
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        if err.errno == errno.EADDRINUSE:
            raise BindError(f"port {port} on {host} is already in use (another server?); stop it, or pass "
                            f"--port with a free port (--port 0 picks one)") from None
        raise BindError(f"cannot listen on {host}:{port}: {err.strerror or err}; pass --host with an address of "
                        f"this machine (127.0.0.1, 0.0.0.0, ::) and --port with a free port") from None
    return sock


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on at `host` now, for a server started next (a benchmark's child `draftsmith serve`).
    Another process may take it first; a server bound in-process should bind port 0 instead (bind_socket)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]
