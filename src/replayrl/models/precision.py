"""Numeric precision policy: fast fp32 matmuls, bf16 generation, learner autocast.

Measured on SmolLM2-135M (2-core AVX-512 BF16 CPU, BENCHMARKS.md): bf16 generation and
learner autocast are ~2x faster than fp32, but move log-probs by ~0.02 on average (0.3-0.6
at worst), far above fp32's 1e-4; see `PiOld` in replayrl/learner/pi_old.py for the
importance-ratio fix. oneDNN's fp32 kernels are ~1.4-2.5x faster than the default path here
at fp32 accuracy.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from replayrl.storage.io import atomic_write_json

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _matmul_error() -> float:
    """Relative error of an fp32 Linear forward and backward against float64."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 256, generator=g)
    w = torch.randn(192, 256, generator=g)
    gy = torch.randn(64, 192, generator=g)
    xr = x.clone().requires_grad_(True)
    y = torch.nn.functional.linear(xr, w)
    y.backward(gy)
    ref_y = x.double() @ w.double().T
    ref_gx = gy.double() @ w.double()
    err_y = float((y.detach().double() - ref_y).abs().max() / ref_y.abs().max())
    assert xr.grad is not None  # backward above filled it
    err_gx = float((xr.grad.double() - ref_gx).abs().max() / ref_gx.abs().max())
    return max(err_y, err_gx)


def enable_fast_fp32_matmul() -> bool:
    """Route CPU fp32 matmuls through oneDNN when that keeps fp32 accuracy; True if on.

    torch's `mkldnn.matmul.fp32_precision = "tf32"` lets oneDNN take fp32 matmuls; a CPU
    without TF32 units (every x86 CPU today) then runs oneDNN's fp32 kernels, measured here
    at 2.5x the default path with the same 6e-7 relative error. A CPU that did round to TF32
    would fail the accuracy check below (TF32 keeps 10 mantissa bits: ~1e-3), and the
    setting is put back. Process-wide; no effect on CUDA matmuls.
    """
    backend = getattr(getattr(torch.backends, "mkldnn", None), "matmul", None)
    if backend is None or not torch.backends.mkldnn.is_available():
        return False
    try:
        saved = backend.fp32_precision
        backend.fp32_precision = "tf32"
    except (AttributeError, RuntimeError, ValueError):
        return False
    if _matmul_error() > 1e-5:
        backend.fp32_precision = saved
        return False
    return True


def disable_fast_fp32_matmul() -> None:
    """torch's default fp32 matmul path (the `old` rows of `replayrl bench speed`)."""
    backend = getattr(getattr(torch.backends, "mkldnn", None), "matmul", None)
    if backend is not None:
        with contextlib.suppress(AttributeError, RuntimeError, ValueError):
            backend.fp32_precision = "none"


def generation_dtype(name: str, model_dtype: torch.dtype) -> torch.dtype | None:
    """The dtype to generate in (None: the policy's own); `auto` = the policy's dtype."""
    if name == "auto":
        return None
    dtype = DTYPES[name]
    return None if dtype == model_dtype else dtype


def autocast_dtype(name: str) -> torch.dtype | None:
    """The learner's autocast dtype (None: no autocast; `auto` unresolved: none)."""
    return None if name in ("none", "auto") else DTYPES[name]


@contextlib.contextmanager
def autocast(dtype: torch.dtype | None, device: torch.device) -> Iterator[None]:
    """torch.autocast to `dtype` on `device` (fp32 master weights stay as they are)."""
    if dtype is None:
        yield
        return
    with torch.autocast(device_type=device.type, dtype=dtype):
        yield


# -- precision: auto ----------------------------------------------------------------------
# bf16 pays only where the CPU computes it natively (AVX-512 BF16 / AMX): on an AVX-512 CPU
# without them torch emulates bf16 matmuls at about half the fp32 rate (measured: 32.8 vs
# 63.6 GFLOP/s), so a bf16 run there is 1.5-2.6x slower than fp32. `auto` therefore asks the
# hardware: CPU flags as a free pre-filter, then a short timed bf16-vs-fp32 matmul (like
# oneDNN's own ISA check), cached per machine so a run pays for it once.

# bf16 must beat fp32 by this factor at learner-like shapes to be chosen: below it the log-prob
# mismatch bf16 brings (0.02 mean, 0.3-0.6 max) is not worth the time
BF16_MIN_SPEEDUP = 1.3
# models smaller than this stay fp32 under `auto`: their steps are per-token overhead, not
# matmuls (the built-in tiny model: 0.4M parameters), so a bf16 copy gains nothing
BF16_MIN_PARAMS = 20_000_000
_CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")  # x86 (AVX-512, AMX); Arm (FEAT_BF16)
ENV_OVERRIDE = "REPLAYRL_BF16"  # 1 / 0: take this as the self-check's result (tests, CI)


@dataclass(frozen=True)
class HardwareCheck:
    """Whether this machine computes bf16 natively, and why."""

    native: bool
    reason: str
    bf16_gflops: float | None = None
    fp32_gflops: float | None = None
    cached: bool = False


@dataclass(frozen=True)
class PrecisionChoice:
    """The resolved precision of a run: generation dtype (None: the model's own) and learner
    autocast dtype (None: none), with the reason printed at start and kept in summary.json."""

    generation: torch.dtype | None
    learner_autocast: torch.dtype | None
    reason: str

    def as_dict(self) -> dict[str, str]:
        def name(d: torch.dtype | None, default: str) -> str:
            return default if d is None else str(d).removeprefix("torch.")

        return {
            "generation": name(self.generation, "model dtype"),
            "learner_autocast": name(self.learner_autocast, "none"),
            "reason": self.reason,
        }

    def describe(self) -> str:
        d = self.as_dict()
        gen, ac = d["generation"], d["learner_autocast"]
        return f"generation {gen}, learner autocast {ac} ({d['reason']})"


def cpu_info() -> dict[str, Any]:
    """CPU model name and the flags that decide bf16/fp32 speed (from /proc/cpuinfo)."""
    model: str = platform.processor() or platform.machine()
    flags: set[str] = set()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "model name" and model in ("", platform.machine(), platform.processor()):
                model = value.strip()
            elif key in ("flags", "Features") and not flags:
                flags = set(value.split())
    relevant = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_tile", "bf16")
    return {"model": model, "flags": sorted(f for f in relevant if f in flags)}


def cache_path() -> Path:
    """The per-machine precision cache: $REPLAYRL_CACHE or ~/.cache/replayrl."""
    root = os.environ.get("REPLAYRL_CACHE") or Path.home() / ".cache" / "replayrl"
    return Path(root) / "precision.json"


def _cache_key(info: dict[str, Any]) -> str:
    return f"{info['model']}|{','.join(info['flags'])}|torch {torch.__version__}"


def _gflops(dtype: torch.dtype, m: int = 128, k: int = 576, n: int = 1536) -> float:
    """Median GFLOP/s of an (m x k) @ (k x n) matmul: a SmolLM2 MLP projection over a
    128-token micro-batch, the learner's and batched decode's dominant shape."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(m, k, generator=g).to(dtype)
    b = torch.randn(k, n, generator=g).to(dtype)
    times = []
    for i in range(5):  # ~4 ms each in fp32 on a 60 GFLOP/s core; the first one warms up
        t0 = time.perf_counter()
        a @ b
        if i >= 1:
            times.append(time.perf_counter() - t0)
    return 2 * m * k * n / statistics.median(times) / 1e9


def _time_bf16() -> tuple[float, float]:
    """(bf16, fp32) matmul GFLOP/s, interleaved so a busy neighbour slows both alike."""
    bf, fp = [], []
    for _ in range(3):
        bf.append(_gflops(torch.bfloat16))
        fp.append(_gflops(torch.float32))
    return statistics.median(bf), statistics.median(fp)


def _read_cache(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}  # missing or damaged: measure again and rewrite it
    return data if isinstance(data, dict) else {}


def hardware_check(use_cache: bool = True) -> HardwareCheck:
    """Does this machine compute bf16 natively? env override > CPU flags > cached timing."""
    forced = os.environ.get(ENV_OVERRIDE)
    if forced in ("0", "1"):
        return HardwareCheck(forced == "1", f"{ENV_OVERRIDE}={forced}")
    info = cpu_info()
    if not any(f in info["flags"] for f in _CPU_BF16_FLAGS):
        return HardwareCheck(False, f"{info['model']}: no avx512_bf16/amx_bf16, bf16 emulated")
    path, key = cache_path(), _cache_key(info)
    if use_cache:
        hit = _read_cache(path).get(key)
        if isinstance(hit, dict) and {"bf16_gflops", "fp32_gflops"} <= hit.keys():
            return _verdict(info, float(hit["bf16_gflops"]), float(hit["fp32_gflops"]), True)
    bf, fp = _time_bf16()
    cache = _read_cache(path)
    cache[key] = {"bf16_gflops": round(bf, 2), "fp32_gflops": round(fp, 2), "at": time.time()}
    with contextlib.suppress(OSError):  # a read-only home only costs a re-check next run
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, cache)
    return _verdict(info, bf, fp, False)


def _verdict(info: dict[str, Any], bf: float, fp: float, cached: bool) -> HardwareCheck:
    native = bf >= BF16_MIN_SPEEDUP * fp
    how = "native" if native else f"< {BF16_MIN_SPEEDUP}x fp32"
    reason = f"{info['model']}: bf16 matmul {bf:.0f} vs fp32 {fp:.0f} GFLOP/s ({how})"
    return HardwareCheck(native, reason, bf, fp, cached)


def choose(
    generation: str,
    learner_autocast: str,
    model_dtype: torch.dtype,
    n_params: int,
    device: torch.device | None = None,
) -> PrecisionChoice:
    """Resolve `precision.generation` / `precision.learner_autocast` (`auto` or a dtype).

    `auto` is bf16 only where it pays: fp32 master weights, a model of at least
    BF16_MIN_PARAMS parameters, and hardware that computes bf16 natively (`hardware_check`);
    otherwise the model's dtype for generation and no learner autocast.
    """
    fixed_gen = None if generation == "auto" else generation_dtype(generation, model_dtype)
    fixed_ac = None if learner_autocast == "auto" else autocast_dtype(learner_autocast)
    if "auto" not in (generation, learner_autocast):
        return PrecisionChoice(fixed_gen, fixed_ac, "as configured")
    if model_dtype != torch.float32:
        bf16, reason = False, f"model weights are {model_dtype}"
    elif device is not None and device.type == "cuda":
        # tensor cores compute bf16 natively whatever the model's size
        bf16, reason = torch.cuda.is_bf16_supported(), "CUDA bf16 support"
    elif n_params < BF16_MIN_PARAMS:
        bf16, reason = False, f"{n_params / 1e6:.1f}M parameters: too small for bf16 to pay"
    else:
        hw = hardware_check()
        bf16, reason = hw.native, hw.reason + (" [cached]" if hw.cached else "")
    auto = torch.bfloat16 if bf16 else None
    return PrecisionChoice(
        auto if generation == "auto" else fixed_gen,
        auto if learner_autocast == "auto" else fixed_ac,
        ("auto -> bf16: " if bf16 else "auto -> fp32: ") + reason,
    )


def choose_for(p: Any, model: torch.nn.Module) -> PrecisionChoice:
    """`choose` for a config's precision section and the model it will run."""
    first = next(model.parameters())
    n = sum(t.numel() for t in model.parameters())
    return choose(p.generation, p.learner_autocast, first.dtype, n, first.device)
