"""`draftsmith serve`: an OpenAI-compatible HTTP server with speculative decoding."""
from __future__ import annotations

import logging
import sys

from draftsmith.serve.core.threads import THREADS_HELP


def add_arguments(parser) -> None:
    # Flags left unset keep the value from --config / key=value overrides (section `serve`).
    parser.add_argument("--target", default=None, help="HF folder, .gguf file, hub id or `demo` (default: demo)")
    parser.add_argument("--drafter", default=None,
                        help="ngram[:max_n=8], model:PATH, oracle, mtp (the target's own MTP layer), a trained "
                             "drafter folder, or hybrid:DIR; the draft "
                             "length is chosen per step unless SPEC:length=fixed (default: ngram)")
    parser.add_argument("--k", type=int, default=None,
                        help="draft tokens per cycle (default: the K the drafter folder records, else 5; at most, "
                             "unless length=fixed)")
    parser.add_argument("--host", default=None, help="bind address (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=None,
                        help="port (default: 8000; 0 picks a free one); a busy port is reported before the model loads")
    parser.add_argument("--max-batch", type=int, default=None,
                        help="requests decoding together; more wait in the queue (default: 8; 1: one at a time)")
    parser.add_argument("--no-speculation", dest="speculation", action="store_false", default=None,
                        help="plain decoding, for comparison")
    parser.add_argument("--served-model-name", default=None,
                        help="the model id /v1/models lists and responses carry (default: the target's folder or hub "
                             "repository name, e.g. SmolLM2-135M-Instruct); requests may also name the target as given "
                             "to --target (e.g. demo, a path or a hub id)")
    parser.add_argument("--threads", type=int, default=None, help=THREADS_HELP)
    parser.add_argument("--record", default=None, metavar="DIR",
                        help="keep every answered request in DIR as training data (serve/core/traffic.py; a request "
                             "sent with \"store\": false is not kept; metadata.domain files it by domain)")


def run(args) -> int:
    from draftsmith.serve.core.config import load_config
    from draftsmith.serve.server import ServeConfig, serve_forever

    flags = {"target.spec": args.target, "target.threads": args.threads, **{name: getattr(args, name) for name in (
        "drafter", "k", "host", "port", "speculation", "served_model_name", "record", "max_batch")}}
    config = load_config(ServeConfig, config_file=args.config, section="serve", overrides=args.overrides,
                         flags=flags)
    logging.basicConfig(level=getattr(logging, config.log_level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    serve_forever(config, log=lambda msg: print(msg, file=sys.stderr, flush=True))
    return 0
