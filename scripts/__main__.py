"""`python -m draftsmith ...`: the command line (what `accelerate launch -m draftsmith` and `torchrun -m draftsmith` run)."""
import sys

from draftsmith.cli import main

sys.exit(main())
