"""`python -m scripts.cli ...` (what `accelerate launch -m scripts.cli` and `torchrun -m scripts.cli` run)."""
import sys

from scripts.cli import main

sys.exit(main())
