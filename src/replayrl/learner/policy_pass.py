"""The policy-gradient pass: the objective's gradient per micro-batch, its diagnostics, and
the policy's optimizer step per mini-batch.

What the loss is lives in `algorithms.objective`; this module runs the policy's forward on a
micro-batch, hands the objective the batch's tensors (a registered loss's declared inputs
through `TrainBatch.loss_inputs`), backpropagates, and after the mini-batch clips and steps.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from replayrl.algorithms import importance_ess
from replayrl.algorithms.advantages import AdvantageSpec
from replayrl.algorithms.correction import apply_token_weights
from replayrl.algorithms.losses import clip_stats
from replayrl.algorithms.objective import ObjectiveWeights, policy_objective
from replayrl.learner.batching import TrainBatch
from replayrl.learner.context import LearnerContext
from replayrl.learner.lr_schedule import StepSchedule, warmup_steps


@dataclass
class Accum:
    """Per-mini-batch sums over micro-batches (token-weighted metrics, ratio diagnostics)."""

    sums: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    ratio_max: float = 0.0
    seq_log_ratios: list[torch.Tensor] = field(default_factory=list)
    ratios: list[torch.Tensor] = field(default_factory=list)
    centres: list[torch.Tensor] = field(default_factory=list)
    stale: list[torch.Tensor] = field(default_factory=list)
    # detached log-probs of the current micro-batch (the fused log pi_old of fresh rollouts)
    current: torch.Tensor | None = None


class PolicyPass:
    """The policy's optimizer (AdamW over what trains; with LoRA the adapters) and its
    learning-rate schedule, and the policy objective's backward and step."""

    def __init__(
        self,
        ctx: LearnerContext,
        model: torch.nn.Module,
        loss_type: str,
        advantage: AdvantageSpec,
    ) -> None:
        self.ctx, self.model, self.loss_type, self.advantage = ctx, model, loss_type, advantage
        self.optimizer, self.lr_schedule = self._optimizer()
        self.updates = 0  # optimizer steps taken

    def _optimizer(self) -> tuple[torch.optim.AdamW, StepSchedule]:
        t = self.ctx.cfg.train
        optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad],
            lr=t.lr,
            weight_decay=t.weight_decay,
        )
        # train.lr_scheduler: the lr of each step, set before its updates
        schedule = StepSchedule(
            optimizer,
            t.lr_scheduler,
            t.steps,
            warmup_steps(t.steps, t.warmup_steps, t.warmup_ratio),
        )
        return optimizer, schedule

    def renew_optimizer(self) -> None:
        """A new optimizer and schedule over the policy's parameters now (sharding replaced
        them: run/distributed/fsdp.py)."""
        self.optimizer, self.lr_schedule = self._optimizer()

    def backward(
        self,
        b: TrainBatch,
        w: ObjectiveWeights,
        knobs: Mapping[str, float | None],
        normaliser: float,
        acc: Accum,
    ) -> TrainBatch:
        """The objective's gradient on one micro-batch, and its diagnostics into `acc`;
        returns the micro-batch as the loss saw it (a fused refresh sets log pi_old)."""
        mask = b.mask
        logps, entropy = self.ctx.logprobs(self.model, b, entropy_grad=w.entropy_coef > 0)
        if b.fuse is not None:
            b = self._fuse(b, logps, acc)
        adv = b.token_advantages if not self.advantage.at_generation else b.advantages
        assert adv is not None  # a critic's estimator adds token_advantages
        if b.tis_weights is not None:  # truncated IS: w * loss_t == loss_t with w * A_t
            adv = apply_token_weights(adv, b.tis_weights)
        loss_mask = mask
        if self.ctx.cfg.algorithm.mask_truncated_completions:
            # TRL's mask_truncated_completions: a completion cut at max_new_tokens adds no
            # term to the loss (its group's advantages were computed with it, as TRL does)
            loss_mask = mask * (1.0 - b.truncated)[:, None]
        terms = policy_objective(
            self.loss_type,
            logps,
            entropy,
            b.old_logprobs,
            adv,
            loss_mask,
            b.loss_inputs(),
            dict(knobs),
            w,
            normaliser,
        )
        acc.sums["policy_loss"] += terms.policy_loss.item()
        if terms.kl_loss is not None:
            acc.sums["kl_loss"] += terms.kl_loss.item()
        terms.total.backward()
        acc.sums["loss"] += terms.total.item()
        with torch.no_grad():
            self.diagnostics(b, logps, entropy, acc)
        part_tokens = float(mask.sum())
        for k, v in terms.metrics.items():  # token-weighted average over micro-batches
            if k == "ratio_max":
                acc.ratio_max = max(acc.ratio_max, v)
            else:
                acc.sums[k] += v * part_tokens
        return b

    @staticmethod
    def _fuse(b: TrainBatch, logps: torch.Tensor, acc: Accum) -> TrainBatch:
        """Fused refresh: log pi_old = log pi_theta (detached) on fresh rollouts' tokens, so
        their ratio is exactly 1 and the gradient that of the on-policy objective."""
        assert b.fuse is not None
        current = logps.detach()
        acc.current = current
        f = b.fuse.bool()
        anchor = b.anchor_logprobs  # fresh data: c = pi_k / pi_beh = 1
        return b.replace(
            old_logprobs=torch.where(f, current, b.old_logprobs),
            anchor_logprobs=torch.where(f, current, anchor) if anchor is not None else None,
        )

    def idle_backward(self, b: TrainBatch) -> None:
        """A forward and backward that adds nothing (zero weight): a sharded rank with fewer
        micro-batches than another joins the other's all-gathers and reduce-scatters."""
        logps, _ = self.ctx.logprobs(self.model, b)
        (logps.sum() * 0.0).backward()

    @staticmethod
    def diagnostics(b: TrainBatch, logps: torch.Tensor, entropy: torch.Tensor, acc: Accum) -> None:
        mask = b.mask
        log_ratio = (logps - b.old_logprobs) * mask
        acc.seq_log_ratios.append(log_ratio.sum(-1))
        acc.sums["entropy"] += float((entropy.detach() * mask).sum())
        for name, ref in (("base", b.base_logprobs), ("prev", b.prev_logprobs)):
            if ref is not None:
                kl = torch.exp(ref - logps) - 1 - (ref - logps)  # k3 for logging
                acc.sums[f"kl_to_{name}"] += float((kl * mask).sum())
        m = mask.bool()
        acc.ratios.append(torch.exp(logps.detach() - b.old_logprobs)[m])
        anchor = b.anchor_logprobs
        acc.centres.append(
            torch.exp(anchor - b.old_logprobs)[m]
            if anchor is not None
            else torch.ones_like(acc.ratios[-1])
        )
        assert b.stale is not None  # set by the frozen passes before any update
        acc.stale.append(b.stale[m].bool())

    def step(self, acc: Accum, tokens: int) -> dict[str, float]:
        """Clip, step (or skip a non-finite gradient), and the mini-batch's metrics."""
        max_norm = self.ctx.cfg.train.max_grad_norm
        grad_hook = self.ctx.ranks.grad_hook
        if grad_hook is not None:  # every rank, same parameter order
            grad_hook([p for p in self.model.parameters() if p.requires_grad])
        params = [p for p in self.model.parameters() if p.grad is not None]
        grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm else math.inf)
        sums = acc.sums
        if not torch.isfinite(grad_norm):
            # a non-finite gradient would poison the weights: skip the step and say so
            self.optimizer.zero_grad(set_to_none=True)
            return {"loss": sums["loss"], "grad_norm": float(grad_norm), "skipped_updates": 1.0}
        self.optimizer.step()
        self.updates += 1
        out: dict[str, float] = {
            k: sums.pop(k) for k in ("loss", "policy_loss", "kl_loss") if k in sums
        }
        out.update({k: v / max(tokens, 1) for k, v in sums.items()})
        a = self.ctx.cfg.algorithm
        eps_high = a.epsilon if a.epsilon_high is None else a.epsilon_high
        out.update(
            clip_stats(
                torch.cat(acc.ratios),
                torch.cat(acc.centres),
                torch.cat(acc.stale),
                a.epsilon,
                eps_high,
            )
        )
        out.update(
            ratio_max=acc.ratio_max,
            ess=importance_ess(torch.cat(acc.seq_log_ratios)),
            grad_norm=float(grad_norm),
            lr=self.optimizer.param_groups[0]["lr"],
            skipped_updates=0.0,
        )
        return out
