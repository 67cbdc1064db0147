"""Stopping the server on SIGTERM / Ctrl+C within a time limit.

uvicorn stops taking connections and waits for the open ones to finish, as long as they take. `DrainingServer`
bounds that wait: the running and queued requests get `drain_seconds` to finish; then the engine cancels what is
left, each client being answered with an error (a 503 JSON body, or an error event and `data: [DONE]` on a stream)
rather than a dropped connection, and uvicorn's own limit (a few seconds later) ends any connection still open.
A second Ctrl+C still quits at once.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Callable

import uvicorn

log = logging.getLogger("draftsmith.serve")

ANSWER_SECONDS = 5.0  # after the cancel, the time left for the error answers to go out


def drain_message(drain_seconds: float) -> str:
    return (f"the server is shutting down and this request did not finish within its drain limit "
            f"({drain_seconds:g} s, serve.drain_seconds); send it again")


class DrainingServer(uvicorn.Server):
    """uvicorn's server whose shutdown calls `cancel(message)` once `drain_seconds` have passed."""

    def __init__(self, config: uvicorn.Config, *, drain_seconds: float, cancel: Callable[[str], None]):
        config.timeout_graceful_shutdown = drain_seconds + ANSWER_SECONDS
        super().__init__(config)
        self.drain_seconds = drain_seconds
        self.cancel = cancel

    async def shutdown(self, sockets=None) -> None:
        def cancel() -> None:
            log.warning("drain limit (%g s, serve.drain_seconds) reached: cancelling the requests left",
                        self.drain_seconds)
            self.cancel(drain_message(self.drain_seconds))

        timer = asyncio.get_running_loop().call_later(self.drain_seconds, cancel)
        try:
            await super().shutdown(sockets)
        finally:
            timer.cancel()
