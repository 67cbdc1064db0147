"""What this machine can do, measured in a few seconds: the CPU and its ISA features, matmul throughput per dtype
and thread count with the cores idle now, and the target's own forwards (one decode step, a batched decode step,
a prefill). `draftsmith demo` picks its compute dtype and threads from it and sizes every stage to its budget.

    hw = probe_hardware()                      # no model needed: picks dtype and threads
    rates = probe_target(target, batch=32, prefill_tokens=2048)

bf16 is fast only where the CPU has AMX or AVX512-BF16 (an AVX2-only EPYC runs a bf16 matmul ~100x slower than
fp32), so the choice is measured, never assumed from the flags.
"""
from __future__ import annotations

import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: the target's module imports torch
    from draftsmith.serve.core.target import Target

# the /proc/cpuinfo flags that decide which dtype is fast on a CPU
ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "avx512_fp16", "amx_fp16")
BF16_GAIN = 1.1  # bf16 compute is chosen only where its matmul is this much faster than fp32
_MATMUL = (256, 576, 1536)  # (rows, in, out): a small decoder's MLP at a batch of tokens
_SAMPLE_SECONDS = 0.25
BUILD_REPEATS = 5  # batched steps timed per context (interleaved), the fastest kept


@dataclass(frozen=True)
class HardwareProfile:
    cpu: str  # the CPU model
    isa: list[str]  # ISA_FLAGS the CPU has
    torch_capability: str  # torch's own dispatch level (AVX2, AVX512, ...)
    usable_cores: int
    idle_cores: float | None  # idle when measured (serve/core/threads.py)
    gflops: dict[str, dict[int, float]]  # dtype -> threads -> fp GFLOP/s of the probe matmul
    threads: int  # chosen: the fastest thread count for the chosen dtype among the idle cores
    dtype: str  # chosen compute dtype: float32 | bfloat16
    why: str  # one line: what was chosen and why

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class TargetRates:
    """The target's forwards at the chosen dtype and threads."""
    dtype: str
    threads: int
    step_seconds: float  # one decode step of one row (a cache of 64 tokens): what plain decoding costs per token
    batch: int
    batch_step_seconds: float  # one step of self-distillation's batched decoder, `batch` rows of 64 cached tokens
    prefill_tokens: int
    prefill_seconds: float  # one forward over `prefill_tokens` tokens (what capture runs), lm_head included
    batch_step_flops: float = 0.0  # the batched step's linears: 2 x every linear weight x `batch` rows
    window: int = 0  # cached tokens of the second batched step: the workload's typical window (0: not measured)
    window_step_seconds: float = 0.0  # that step, `batch` rows of `window` cached tokens (what the plan reads)

    @property
    def generate_tokens_per_second(self) -> float:
        return self.batch / self.batch_step_seconds

    @property
    def window_tokens_per_second(self) -> float:
        """Self-distillation's step rate over its typical window (the 64-token step's where none was measured)."""
        return self.batch / self.window_step_seconds if self.window_step_seconds else self.generate_tokens_per_second

    @property
    def batch_step_gflops(self) -> float:
        """GFLOP/s the batched step's linears ran at (its attention, norms and overhead count as time)."""
        return self.batch_step_flops / self.batch_step_seconds / 1e9

    @property
    def prefill_tokens_per_second(self) -> float:
        return self.prefill_tokens / self.prefill_seconds

    def to_dict(self) -> dict:
        return {**asdict(self), "generate_tokens_per_second": round(self.generate_tokens_per_second, 1),
                "prefill_tokens_per_second": round(self.prefill_tokens_per_second, 1)}


def cpu_model() -> str:
    for line in _cpuinfo().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def isa_features() -> list[str]:
    flags: set[str] = set()
    for line in _cpuinfo().splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    return [f for f in ISA_FLAGS if f in flags]


def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:  # macOS, Windows
        return ""


def matmul_gflops(dtype: str, threads: int, seconds: float = _SAMPLE_SECONDS) -> float:
    """GFLOP/s of a (256 x 576) @ (576 x 1536) matmul in `dtype` on `threads` torch threads."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        dt = getattr(torch, dtype)
        m, k, n = _MATMUL
        a, b = torch.randn(m, k).to(dt), torch.randn(k, n).to(dt)
        a @ b  # first call: allocation, kernel choice
        count, start = 0, time.perf_counter()
        while True:
            a @ b
            count += 1
            elapsed = time.perf_counter() - start
            if elapsed >= seconds:  # one call at least: bf16 without AMX takes ~0.3 s each
                break
        return 2 * m * k * n * count / elapsed / 1e9
    finally:
        torch.set_num_threads(previous)


def choose(gflops: dict[str, dict[int, float]], *, idle: float | None, usable: int,
           requested_threads: int | None = None, requested_dtype: str | None = None) -> tuple[str, int, str]:
    """(dtype, threads, why) from the measured throughput: bf16 only where it beats fp32 by BF16_GAIN; the fewest
    threads within 10% of the fastest count among the cores idle now (a busy core makes torch's threads wait)."""
    from draftsmith.serve.core.threads import choose_threads

    ceiling = choose_threads(None, default=usable, idle=idle)
    best = {dtype: max(v for t, v in by.items() if t <= ceiling) for dtype, by in gflops.items() if by}
    if requested_dtype:
        dtype, reason = requested_dtype, "as configured"
    elif best.get("bfloat16", 0.0) > BF16_GAIN * best["float32"]:
        dtype = "bfloat16"
        reason = f"bf16 matmul {best['bfloat16']:.0f} GFLOP/s against fp32 {best['float32']:.0f}"
    else:
        dtype = "float32"
        reason = (f"fp32 matmul {best['float32']:.0f} GFLOP/s against bf16 {best.get('bfloat16', 0.0):.1f}"
                  if "bfloat16" in best else "fp32")
    by = gflops.get(dtype) or gflops["float32"]
    if requested_threads:
        threads = requested_threads
    else:
        top = max(v for t, v in by.items() if t <= ceiling)
        threads = min(t for t, v in by.items() if t <= ceiling and v >= 0.9 * top)
    idle_note = f", {idle:.1f} of {usable} cores idle" if idle is not None else ""
    return dtype, threads, f"{dtype} on {threads} thread{'s' * (threads != 1)} ({reason}{idle_note})"


def probe_hardware(*, requested_threads: int | None = None, requested_dtype: str | None = None,
                   dtypes: tuple[str, ...] = ("float32", "bfloat16")) -> HardwareProfile:
    """Measure the matmul throughput per dtype for 1..N threads (N: the usable cores) and choose (about 2 s)."""
    import torch

    from draftsmith.serve.core.threads import idle_cores, torch_default_threads, usable_cores

    usable = min(usable_cores(), torch_default_threads())  # OMP_NUM_THREADS caps it, as it caps torch
    idle = idle_cores()
    counts = sorted({1, 2, usable} & set(range(1, usable + 1))) if usable > 2 else list(range(1, usable + 1))
    gflops = {dt: {t: round(matmul_gflops(dt, t), 2) for t in counts} for dt in dtypes}
    dtype, threads, why = choose(gflops, idle=idle, usable=usable, requested_threads=requested_threads,
                                 requested_dtype=requested_dtype)
    return HardwareProfile(cpu=cpu_model(), isa=isa_features(), torch_capability=_capability(torch),
                           usable_cores=usable, idle_cores=None if idle is None else round(idle, 2), gflops=gflops,
                           threads=threads, dtype=dtype, why=why)


def linear_flops_per_row(model) -> int:
    """2 x the weights of every linear layer (the lm_head included): a decode step's FLOPs per row, attention
    aside."""
    import torch

    return 2 * sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


def _capability(torch) -> str:
    try:
        return str(torch.backends.cpu.get_cpu_capability())
    except AttributeError:
        return "unknown"


def probe_target(target: Target, *, batch: int, prefill_tokens: int, window: int = 0,
                 repeats: int = 3) -> TargetRates:
    """Time the target's forwards at the current dtype and threads: a one-row decode step (the fastest of
    `repeats`), a `batch`-row step of self-distillation's own decoder over 64 cached tokens and the same over
    `window` cached tokens where window > 64 (a step's attention grows with its window: on the default target in
    bf16, 64 rows over 252 tokens cost 1.5x those over 64; the fastest of BUILD_REPEATS, interleaved), and one
    prefill over `prefill_tokens` tokens in rows of 512."""
    import torch

    from draftsmith.serve.batch.decoder import BatchDecoder, Job
    from draftsmith.serve.core.invariant import suspended
    from draftsmith.serve.core.kv import cache_kwargs, new_cache

    model = target.model
    device = next(model.parameters()).device
    vocab = min(int(target.config.vocab_size), 1000)

    def ids(rows: int, length: int) -> torch.Tensor:
        return torch.randint(10, vocab, (rows, length), device=device)

    def decode_step(rows: int, context: int) -> float:
        cache = new_cache(model, rolls_back=False)
        model(ids(rows, context), **cache_kwargs(model, cache))
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            model(ids(rows, 1), **cache_kwargs(model, cache))
            best = min(best, time.perf_counter() - start)
        return best

    def build_steps(rows: int, contexts: list[int]) -> list[float]:
        """Steps of what `data build` runs: the batched decoder over its slot cache (serve/batch/decoder.py), not
        transformers' DynamicCache, whose concatenation took 11% of a 64-row step; one decoder per context, their
        steps interleaved and the fastest of BUILD_REPEATS each kept (a busy moment of the machine then slows one
        step of each, not every step one context had)."""
        decoders = []
        for context in contexts:
            decoder = BatchDecoder(target, None, slots=rows)
            for row in range(rows):  # no end of answer: every row decodes every step
                decoder.add(Job(row, ids(1, context)[0].tolist(), max_new_tokens=BUILD_REPEATS + 2,
                                eos_token_ids=()))
            decoder.step()  # the prefill
            decoders.append(decoder)
        best = [float("inf")] * len(decoders)
        for _ in range(BUILD_REPEATS):
            for i, decoder in enumerate(decoders):
                start = time.perf_counter()
                decoder.step()
                best[i] = min(best[i], time.perf_counter() - start)
        return best

    with torch.inference_mode():
        step = decode_step(1, 64)  # decoding's kernels: batch-invariant where the target is (evaluation, serving)
        with suspended(model):  # self-distillation and capture run the ordinary ones (serve/core/invariant.py)
            batch_step, *longer = build_steps(batch, [64] + ([window] if window > 64 else []))
            window_step = longer[0] if longer else 0.0
            length = min(512, prefill_tokens)
            rows = max(1, prefill_tokens // length)
            start = time.perf_counter()
            model(ids(rows, length), use_cache=False)
            prefill = time.perf_counter() - start
    return TargetRates(dtype=str(model.dtype).replace("torch.", ""), threads=torch.get_num_threads(),
                       step_seconds=step, batch=batch, batch_step_seconds=batch_step, prefill_tokens=rows * length,
                       prefill_seconds=prefill, batch_step_flops=float(linear_flops_per_row(model) * batch),
                       window=window if window_step else 0, window_step_seconds=window_step)


@dataclass
class MachineReport:
    """The probe's lines for the console and demo_summary.json."""
    hardware: HardwareProfile
    target: TargetRates | None = None
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        hw = self.hardware
        scaling = ", ".join(f"{t} thread{'s' * (t != 1)} {v:.0f}" for t, v in hw.gflops["float32"].items())
        bf16 = ", ".join(f"{t}: {v:.1f}" for t, v in hw.gflops.get("bfloat16", {}).items())
        out = [f"machine: {hw.cpu} ({', '.join(hw.isa) or 'no AVX2'}; torch {hw.torch_capability}), "
               f"{hw.usable_cores} cores",
               f"matmul GFLOP/s fp32: {scaling}" + (f"; bf16: {bf16}" if bf16 else ""),
               f"chosen: {hw.why}"]
        if self.target:
            t = self.target
            peak = hw.gflops.get(t.dtype, {}).get(t.threads)
            share = (f"; its linears {t.batch_step_flops / 1e9:.1f} GFLOP at {t.batch_step_gflops:.0f} GFLOP/s, "
                     f"{t.batch_step_gflops / peak:.0%} of the {t.dtype} matmul's {peak:.0f}"
                     if peak and t.batch_step_flops else "")
            over = (f", over {t.window} tokens {t.window_step_seconds * 1e3:.0f} ms "
                    f"({t.window_tokens_per_second:.0f} tok/s)" if t.window_step_seconds else "")
            out.append(f"target: one decode step {t.step_seconds * 1e3:.0f} ms, {t.batch} rows "
                       f"{t.batch_step_seconds * 1e3:.0f} ms ({t.generate_tokens_per_second:.0f} tok/s{share}){over}, "
                       f"prefill {t.prefill_tokens_per_second:.0f} tok/s")
        return out + self.notes

    def to_dict(self) -> dict:
        return {"hardware": self.hardware.to_dict(), "target": self.target.to_dict() if self.target else None,
                "seconds": round(self.seconds, 2), "notes": self.notes}
