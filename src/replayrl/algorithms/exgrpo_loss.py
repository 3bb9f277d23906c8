"""ExGRPO's mixed-policy loss (Zhan et al., arXiv 2510.02245, sec. 3.2) as a registered
policy loss.

    J(theta) = (1 - rho) E_on[ 1/K sum_i CLIP(w_i, A_i) ]
             + rho E_exp[ 1/K ( f(w*) A(o*) + sum_{i<K} CLIP(w_i, A_i) ) ]

w_i = pi_theta / pi_theta_old on fresh tokens, clipped as GRPO; on a replayed trajectory o*
w* = pi_theta / pi_theta_past (its behaviour log-probs, recorded when it was generated), shaped
by f(w) = w / (w + beta) (policy shaping, beta = 0.1; the code's `off_policy_reshape=p_div_p_0.1`
with the importance correction `exp_is_correct=True`) and not clipped. The share rho is set by
the batch's composition (methods/exgrpo.py), so the loss sees one batch and aggregates
as every other loss (`algorithm.loss_agg`); which tokens are replayed is the learner's `stale`
field.
"""

from __future__ import annotations

import torch

from replayrl.algorithms.aggregation import aggregate
from replayrl.algorithms.losses import ratio_metrics, register_policy_loss


def policy_shaping(w: torch.Tensor, beta: float) -> torch.Tensor:
    """f(w) = w / (w + beta) (arXiv 2510.02245 sec. 3.2, policy shaping; from LUFFY): its
    gradient w.r.t. w, beta / (w + beta)^2, is large where the policy gives the replayed token
    low probability and small where it is already likely."""
    return w / (w + beta)


@register_policy_loss(
    "exgrpo",
    inputs=("stale",),
    knobs={
        "epsilon": "algorithm.epsilon",
        "epsilon_high": "algorithm.epsilon_high",
        "shaping_beta": "method.exgrpo.shaping_beta",
    },
    requires={"method.name": "exgrpo"},
    why="it shapes every stale rollout's ratio (f(w) A, not clipped), which is ExGRPO's "
    "objective for its replayed trajectories only; use another loss here (e.g. grpo_clip)",
)
def exgrpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    stale: torch.Tensor,
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
    shaping_beta: float = 0.1,
    loss_agg: str = "token_mean",
    normaliser: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Per token: fresh -min(w A, clip(w, 1-eps_low, 1+eps_high) A); replayed (stale = 1)
    -f(w*) A, f(w) = w / (w + beta) (arXiv 2510.02245 sec. 3.2, the mixed-policy objective)."""
    if stale.shape != logprobs.shape:
        raise ValueError(f"stale has shape {tuple(stale.shape)}, tokens {tuple(logprobs.shape)}")
    eps_high = epsilon if epsilon_high is None else epsilon_high
    log_ratio = logprobs - old_logprobs
    ratio = torch.exp(log_ratio)
    adv = (advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages).to(logprobs.dtype)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1 - epsilon, 1 + eps_high) * adv
    on = -torch.minimum(unclipped, clipped)
    off = -policy_shaping(ratio, shaping_beta) * adv
    old = stale.to(logprobs.dtype)
    per_token = old * off + (1 - old) * on
    loss = aggregate(per_token, mask, loss_agg, normaliser)
    with torch.no_grad():
        metrics = ratio_metrics(
            log_ratio, mask, (clipped < unclipped).to(logprobs.dtype) * (1 - old)
        )
        m = mask * old
        n_off = float(m.sum())
        metrics["off_policy/shaped_ratio_mean"] = (
            float((policy_shaping(ratio, shaping_beta) * m).sum() / n_off) if n_off else 0.0
        )
    return loss, metrics
