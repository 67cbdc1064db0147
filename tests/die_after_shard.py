"""Run under torchrun: `draftsmith ARGS...`, where rank 1 dies (os._exit, as a killed process would) when it is about
to write its second shard (a process lost in the middle of a capture)."""
from __future__ import annotations

import os
import sys

import draftsmith.data.capture
from draftsmith.cli import main

if __name__ == "__main__":
    if os.environ.get("RANK") == "1":
        write_shard, written = draftsmith.data.capture.write_shard, []

        def write_then_die(*args, **kwargs):
            if written:
                os._exit(9)
            written.append(1)
            return write_shard(*args, **kwargs)

        draftsmith.data.capture.write_shard = write_then_die
    sys.exit(main(sys.argv[1:]))
