"""Per-sample policy-gradient vectors, projected, for measuring alpha and rho of arXiv
2604.08706's design (replayrl.design.staleness gives the definitions).

Each rollout's gradient is that of the learner's own policy loss (its `algorithm.loss_type`,
clip and aggregation; no KL or entropy term: the design models the policy gradient's noise)
at the current weights, with the rollout's stored behaviour log-probs and advantage, i.e.
what a training step on that rollout would follow: the loss gets every input and knob it
declares (a rollout of an earlier policy is `stale`, as the training step marks it).
Projection (not specified: our choice): the gradient w.r.t. the output embedding (LM head)
when it trains, else every trainable tensor, read at a fixed random subset of at most `dims`
coordinates. A coordinate subset keeps inner products and squared norms unbiased up to one
common scale, which neither alpha (a log-log slope) nor rho (a correlation) sees; the head
alone is cheap (its gradient needs no backward through the layers when untied) and carries
the whole loss's token-level signal.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from replayrl.algorithms.losses import call_policy_loss
from replayrl.data.rollout_record import Rollout, is_stale
from replayrl.learner.batching import collate

if TYPE_CHECKING:
    from replayrl.learner.learner import Learner

DIMS = 4096  # projected coordinates kept per sample


def probe_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The LM head's weight if it trains, else every trainable parameter (LoRA adapters)."""
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    weight = getattr(head, "weight", None)
    if isinstance(weight, torch.nn.Parameter) and weight.requires_grad:
        return [weight]
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the policy has no trainable parameter to take a gradient of")
    return params


def coordinate_subset(total: int, dims: int, seed: int) -> torch.Tensor:
    """A fixed random subset of min(dims, total) of `total` flat coordinates (sorted)."""
    if total < 1 or dims < 1:
        raise ValueError(f"need total >= 1 and dims >= 1, got {total}, {dims}")
    if dims >= total:
        return torch.arange(total)
    g = torch.Generator().manual_seed(seed)
    return torch.sort(torch.randperm(total, generator=g)[:dims]).values


def sample_gradients(
    learner: Learner, rollouts: Sequence[Rollout], dims: int = DIMS, seed: int = 0
) -> np.ndarray:
    """(n, k) projected per-sample gradients of the learner's policy loss (module docstring).

    Needs advantages stored at generation (grpo, rloo): GAE's come from a critic per step.
    The model's weights, gradients and train/eval mode are left as they were.
    """
    if not learner.advantage.at_generation:
        raise ValueError("per-sample gradients need advantages stored at generation (not gae)")
    if not rollouts:
        raise ValueError("no rollouts to take gradients on")
    model, cfg = learner.model, learner.cfg
    params = probe_parameters(model)
    total = sum(p.numel() for p in params)
    idx = coordinate_subset(total, dims, seed)
    knobs = learner.loss_knobs()
    was_training = model.training
    model.eval()  # no dropout noise in a variance measurement
    out = np.empty((len(rollouts), idx.numel()), dtype=np.float64)
    try:
        for i, r in enumerate(rollouts):
            # log pi_old as a training step reads it (the learner's refreshed values if any)
            b = collate([r], learner.pad_id, [learner.pi_old.of(r)], device=learner.device)
            logps, _ = learner.ctx.logprobs(model, b)
            stale = float(is_stale(r, learner.version))
            b = b.replace(
                # the Mix-PPG clip centre is the current policy: pi_k = pi_theta here
                anchor_logprobs=logps.detach(),
                # an earlier policy's rollout, marked as a training step marks it (exgrpo)
                stale=torch.full_like(b.mask, stale, dtype=logps.dtype),
            )
            loss, _ = call_policy_loss(
                learner.loss_type, logps, b.old_logprobs, b.advantages, b.mask,
                b.loss_inputs(), knobs, cfg.algorithm.loss_agg, learner.normaliser([r]),
            )  # fmt: skip
            grads = torch.autograd.grad(loss, params, allow_unused=True)
            flat = torch.cat(
                [
                    (g if g is not None else torch.zeros_like(p)).detach().float().flatten()
                    for g, p in zip(grads, params, strict=True)
                ]
            )
            out[i] = flat[idx].cpu().numpy()
    finally:
        model.train(was_training)
    return out
