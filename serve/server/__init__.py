"""OpenAI-compatible HTTP server on the speculative decoder (FastAPI + uvicorn, the `serve` extra)."""
from __future__ import annotations

from typing import Any

from draftsmith.serve.server.config import ServeConfig

__all__ = ["ServeConfig", "build_app", "serve_forever"]


def build_app(config: ServeConfig, *, log=None) -> Any:
    """Load the target and drafter named in `config` and return the ASGI app."""
    from draftsmith.serve.drafters import build_drafter
    from draftsmith.serve.drafters.settings import draft_settings
    from draftsmith.serve.server.app import create_app
    from draftsmith.serve.server.engine import Engine
    from draftsmith.serve.core.target import load_configured

    config.validate()  # a config built by hand is checked too
    config.target.apply_threads()
    if config.speculation:  # a drafter folder that is missing or for another target: refused before the load
        from draftsmith.serve.drafters.early import check_before_loading

        check_before_loading([config.drafter], config.target.spec)
    if log:
        log(f"loading target {config.target.spec} ({config.target.dtype}, {config.target.device})")
    target = load_configured(config.target)
    drafter = None
    if config.speculation:
        if log:
            log(f"building drafter {config.drafter}")
        drafter = build_drafter(config.drafter, target)
    shape = {key: getattr(config.tree, key) for key in ("depth", "top_k", "total_tokens")
             if getattr(config.tree, key) is not None}
    settings = draft_settings(drafter, k=config.k, tree=config.tree.enabled, shape=shape)
    if log and drafter is not None:
        log(f"drafting {settings.describe()}")
    engine = Engine(target, drafter, k=settings.k, tree=settings.tree, max_queue=config.max_queue,
                    max_batch=config.max_batch, keep_cache_bytes=int(config.keep_cache_mb * (1 << 20)))
    recorder = None
    if config.record:
        from draftsmith.serve.core.traffic import TrafficRecorder

        recorder = TrafficRecorder(config.record, target=target,
                                   max_segment_bytes=int(config.record_segment_mb * (1 << 20)))
        if log:
            log(f"recording answered requests into {config.record} (a request with \"store\": false is not kept)")
    return create_app(engine, model_name=config.served_model_name, aliases=(config.target.spec,),
                      context_length=config.context_length, recorder=recorder, max_body_mb=config.max_body_mb,
                      max_prompt_chars=config.max_prompt_chars)


def serve_forever(config: ServeConfig, *, log=None) -> None:
    """Take the address, build the app and serve it with uvicorn until interrupted."""
    import uvicorn

    from draftsmith.serve.server.bind import bind_socket
    from draftsmith.serve.server.drain import DrainingServer

    config.validate()
    sock = bind_socket(config.host, config.port)  # before loading: a busy port is reported at once
    try:
        app = build_app(config, log=log)
        server = DrainingServer(uvicorn.Config(app, host=config.host, port=config.port, log_level=config.log_level),
                                drain_seconds=config.drain_seconds, cancel=app.state.server.engine.stop)
        if log:  # uvicorn says where it listens only when it binds the socket itself
            host, port = sock.getsockname()[:2]
            log(f"serving on http://{f'[{host}]' if ':' in host else host}:{port} (Ctrl+C to stop)")
        server.run(sockets=[sock])
    finally:
        sock.close()
