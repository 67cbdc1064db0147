"""Run under torchrun: `draftsmith ARGS... --rank1 EXTRA...` where rank 1 alone also gets EXTRA (what a launch whose
processes were given different recipes or target copies looks like)."""
from __future__ import annotations

import os
import sys

from draftsmith.cli import main

if __name__ == "__main__":
    args = sys.argv[1:]
    if "--rank1" in args:
        cut = args.index("--rank1")
        args, extra = args[:cut], args[cut + 1:]
        if os.environ.get("RANK") == "1":
            args += extra
    sys.exit(main(args))
