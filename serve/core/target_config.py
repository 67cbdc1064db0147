"""The target a command runs, as a config section: embedded as `target` in every command's config (`--target`
sets its spec); and `text_config`, the decoder's part of a model's HF config. Kept free of torch, so the command line
can build its parser without importing it. `serve.core.target.load_configured` loads the target a section names."""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Optional

from draftsmith.serve.core.errors import TargetError
from draftsmith.serve.core.ranges import check_ranges

DTYPE_NAMES = ("float32", "fp32", "bfloat16", "bf16", "float16", "fp16")
PACKED_SETTINGS = ("auto", "on", "off")  # target.packed_weights (serve/core/packed.py)
INVARIANT_SETTINGS = ("auto", "on", "off")  # target.invariant (serve/core/invariant.py)
PARALLEL_KINDS = ("none", "tp", "fsdp", "auto")  # target.parallel (serve/core/parallel_layout.py)
_DEVICE = re.compile(r"^(auto|cpu|cuda(:\d+)?|mps)$")


@dataclass
class TargetConfig:
    RANGES: ClassVar[dict[str, str]] = {"threads": ">= 1", "tp_size": ">= 0", "fsdp_size": ">= 0"}
    spec: str = "demo"  # HF folder, .gguf file, hub id, or `demo` / `demo:<name>` (the embedded defaults)
    dtype: str = "float32"  # compute dtype: float32 | bfloat16 | float16 (or fp32 | bf16 | fp16); training: auto
    device: str = "auto"  # auto = cuda when available, else cpu; or cpu | cuda | cuda:N
    threads: Optional[int] = None  # torch CPU threads; None: torch's default, lowered to the cores idle at start
                                   # (serve/core/threads.py)
    packed_weights: str = "auto"  # CPU forwards over 4+ tokens through oneDNN's packed linear (serve/core/packed.py):
                                  # auto (float32 on the CPU, when a second copy of the weights fits) | on | off
    invariant: str = "auto"  # batch-invariant forwards (serve/core/invariant.py): auto (bfloat16 and float16, where
                             # kernels' rounding would flip tokens) | on (float32 too) | off
    parallel: str = "none"  # data capture / train under a launch of several processes: none (the whole target on
                            # each) | tp (transformers' TP plan) | fsdp (FSDP2) | auto (the memory plan's choice)
    tp_size: int = 0  # parallel=tp: processes of a TP group; 0 = the processes of a node
    fsdp_size: int = 0  # processes one copy is FSDP-sharded over; 0 = all (fsdp) or 1 (tp: the groups replicate)

    def validate(self, *, key: str = "target") -> None:
        check_ranges(self, prefix=f"{key}.")
        if self.dtype not in DTYPE_NAMES and self.dtype != "auto":
            raise TargetError(f"{key}.dtype={self.dtype!r}: choose one of {', '.join(DTYPE_NAMES)}")
        if self.parallel not in PARALLEL_KINDS:
            raise TargetError(f"{key}.parallel={self.parallel!r}: choose {', '.join(PARALLEL_KINDS)}")
        if self.packed_weights not in PACKED_SETTINGS:
            raise TargetError(f"{key}.packed_weights={self.packed_weights!r}: choose {', '.join(PACKED_SETTINGS)}")
        if self.invariant not in INVARIANT_SETTINGS:
            raise TargetError(f"{key}.invariant={self.invariant!r}: choose {', '.join(INVARIANT_SETTINGS)}")
        if not _DEVICE.match(self.device):
            raise TargetError(f"{key}.device={self.device!r}: choose auto, cpu, cuda or cuda:N")

    def resolved_device(self) -> str:
        import torch

        if self.device != "auto":
            return self.device
        return "cuda" if torch.cuda.is_available() else "cpu"

    def apply_threads(self, *, log: Callable[[str], None] | None = None):
        """Set torch's CPU thread count (process-wide): `threads` when set, else the busy-machine policy of
        serve/core/threads.py, which says in one line (to `log`, default stderr) when it lowered the default."""
        from draftsmith.serve.core.threads import apply_threads

        return apply_threads(self.threads, log=log or (lambda msg: print(msg, file=sys.stderr, flush=True)))


def text_config(config: Any) -> Any:
    """The decoder's config (multimodal configs keep it under `text_config`)."""
    return getattr(config, "text_config", None) or config
