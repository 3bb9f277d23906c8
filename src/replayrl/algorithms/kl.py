"""KL estimators and ReMix's KL-Convex constraint (arXiv 2507.06892)."""

from __future__ import annotations

import math

import torch


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from samples of pi (Schulman's k1, k2, k3)."""
    log_ratio = ref_logprobs - logprobs  # log pi_ref / pi
    if estimator == "k1":
        return -log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio**2
    if estimator == "k3":
        return torch.exp(log_ratio) - 1 - log_ratio
    raise ValueError(f"kl.estimator: unknown KL estimator {estimator!r} (known: k1, k2, k3)")


def kl_convex_lambda(
    step: int, start: int = 50, every: int = 10, decrement: float = 0.1, floor: float = 0.5
) -> float:
    """lambda(t) = max(1 - 0.1 * ceil(max(t - 50, 0) / 10), 0.5) (paper 2, KL-Convex schedule)."""
    return max(1.0 - decrement * math.ceil(max(step - start, 0) / every), floor)


def kl_convex(
    logprobs: torch.Tensor,
    base_logprobs: torch.Tensor | None,
    prev_logprobs: torch.Tensor | None,
    lam: float,
    estimator: str = "k3",
) -> torch.Tensor:
    """lambda KL(pi || pi_base) + (1 - lambda) KL(pi || pi_{k-1}) per token (paper 2, L_KLC)."""
    out = torch.zeros_like(logprobs)
    if lam > 0:
        if base_logprobs is None:
            raise ValueError("KL-Convex: lambda > 0 needs the base policy's log-probs")
        out = out + lam * kl_estimate(logprobs, base_logprobs, estimator)
    if lam < 1:
        if prev_logprobs is None:
            raise ValueError("KL-Convex: lambda < 1 needs the previous policy's log-probs")
        out = out + (1 - lam) * kl_estimate(logprobs, prev_logprobs, estimator)
    return out
