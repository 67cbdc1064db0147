"""`python -m tests.slow_serve SERVE_ARGS...`: `draftsmith serve` whose drafter is the test's SlowNgram (50 ms a
cycle, K every cycle), so that a request lasts as long as a test needs; a real process, for signals (SIGTERM's
drain, SIGKILL)."""
from __future__ import annotations

import sys

import draftsmith.serve.drafters
from draftsmith.cli import main
from tests.server_fixtures import SlowNgram

if __name__ == "__main__":
    draftsmith.serve.drafters.build_drafter = lambda spec, target: SlowNgram(delay=0.05)
    sys.exit(main(["serve", *sys.argv[1:]]))
