"""`python -m draftsmith.cli ...` (what `accelerate launch -m draftsmith.cli` and `torchrun -m draftsmith.cli` run)."""
import sys

from draftsmith.cli import main

sys.exit(main())
