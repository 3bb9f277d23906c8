"""Numeric precision policy: fast fp32 matmuls, bf16 generation, learner autocast.

Measured on SmolLM2-135M (2-core AVX-512 BF16 CPU, BENCHMARKS.md): bf16 generation and
learner autocast are ~2x faster than fp32, but move log-probs by ~0.02 on average (0.3-0.6
at worst), far above fp32's 1e-4; see `refresh_behaviour_logprobs` in logprobs.py for the
importance-ratio fix. oneDNN's fp32 kernels are ~1.4-2.5x faster than the default path here
at fp32 accuracy.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

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
    """The learner's autocast dtype (None: no autocast)."""
    return None if name == "none" else DTYPES[name]


@contextlib.contextmanager
def autocast(dtype: torch.dtype | None, device: torch.device) -> Iterator[None]:
    """torch.autocast to `dtype` on `device` (fp32 master weights stay as they are)."""
    if dtype is None:
        yield
        return
    with torch.autocast(device_type=device.type, dtype=dtype):
        yield


def is_reduced(dtype: torch.dtype | None) -> bool:
    return dtype is not None and dtype != torch.float32
