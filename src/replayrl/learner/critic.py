"""PPO's value model and the learner's critic pass: GAE fields before the updates, the
clipped value loss's gradient per micro-batch, and the critic's optimizer step."""

from __future__ import annotations

import math
from collections.abc import MutableMapping, Sequence

import torch
from transformers import AutoModel

from replayrl.algorithms.advantages import AdvantageSpec, takes_keyword
from replayrl.algorithms.objective import critic_objective
from replayrl.data.rollout_record import Rollout
from replayrl.learner.assembly import Assembly
from replayrl.learner.batching import TokenRows, TrainBatch
from replayrl.learner.context import LearnerContext
from replayrl.models import precision


def policy_frozen(step: int, warmup_steps: int, has_critic: bool) -> bool:
    """Whether update `step` (1-based) trains only the critic: the first `critic.warmup_steps`
    updates of a run with one. Every data-parallel rank asks this same question, since a rank
    that trains the policy makes an all-reduce the others do not (NCCL then hangs)."""
    return has_critic and step <= warmup_steps


class ValueModel(torch.nn.Module):
    """PPO critic: a transformer backbone (initialised from the policy) + a scalar head."""

    def __init__(self, backbone: torch.nn.Module, hidden_size: int) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = torch.nn.Linear(hidden_size, 1)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)

    @classmethod
    def from_pretrained(cls, path: str) -> ValueModel:
        backbone = AutoModel.from_pretrained(path, dtype=torch.float32)
        return cls(backbone, backbone.config.hidden_size)

    def forward(self, batch: TokenRows) -> torch.Tensor:
        """V(state before each target token), laid out like `mask`."""
        hidden = self.backbone(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask
        ).last_hidden_state
        # fp32 states into an fp32 head; a sharded critic's head is gathered in the compute
        # dtype (train.sharding_param_dtype), so the states meet it in that dtype
        head_dtype = self.head.weight.dtype
        states = hidden[:, :-1].to(torch.float32 if head_dtype == torch.float32 else head_dtype)
        return self.head(states).squeeze(-1)


class CriticPass:
    """The critic and its optimizer: per-token advantages and returns of a step's batch
    (`algorithm.advantage`'s token estimator on the critic's values), then its share of each
    update."""

    def __init__(
        self, ctx: LearnerContext, critic: ValueModel, advantage: AdvantageSpec, assembly: Assembly
    ) -> None:
        self.ctx, self.critic, self.advantage, self.assembly = ctx, critic, advantage, assembly
        self.optimizer = torch.optim.AdamW(critic.parameters(), lr=ctx.cfg.critic.lr)
        # an estimator that keeps statistics over the batch takes `reduce_sum` (several
        # ranks); one written for a single learner is called as it was written
        assert advantage.token is not None
        self.ranked = takes_keyword(advantage.token, "reduce_sum")

    def renew_optimizer(self) -> None:
        """A new optimizer over the critic's parameters now (sharding replaced them:
        run/distributed/fsdp.py)."""
        self.optimizer = torch.optim.AdamW(self.critic.parameters(), lr=self.ctx.cfg.critic.lr)

    def _values(self, mb: TrainBatch) -> torch.Tensor:
        with precision.autocast(self.ctx.autocast, self.ctx.device):  # as the policy runs
            return self.critic(mb)

    def gae_fields(
        self, rollouts: Sequence[Rollout], b: TrainBatch, lengths: Sequence[int]
    ) -> TrainBatch:
        """Critic values of the batch, then the registered token estimator's advantages and
        returns per token (gae: whitened GAE, `algorithm.advantage`), added to `b`."""
        assert self.advantage.token is not None
        device, c = self.ctx.device, self.ctx.cfg.critic
        self.critic.eval()
        values = self.assembly.no_grad(
            lambda mb: self._values(mb).float(), b, lengths, range(len(rollouts))
        )
        self.critic.train()
        # the estimator runs along each completion: its tokens left-aligned, [n, longest]
        comp = torch.tensor([r.completion_ids.numel() for r in rollouts], device=device)
        width = int(comp.max())
        msk = (torch.arange(width, device=device)[None, :] < comp[:, None]).float()
        sel, left = b.mask.bool(), msk.bool()
        val = torch.zeros_like(msk).masked_scatter(left, values[sel])
        rew = torch.zeros_like(msk)
        rows = torch.arange(len(rollouts), device=device)
        has = comp > 0
        rewards = torch.tensor([r.reward for r in rollouts], device=device)
        rew[rows[has], comp[has] - 1] = rewards[has]  # outcome reward on the last token
        # statistics over the whole step's batch: with several ranks, over all their rows
        reduce_sum = self.ctx.ranks.count_reducer
        ranks = {"reduce_sum": reduce_sum} if reduce_sum is not None and self.ranked else {}
        adv, ret = self.advantage.token(rew, val, msk, c.gamma, c.lam, **ranks)
        zeros = torch.zeros_like(b.mask)
        return b.replace(
            token_advantages=zeros.masked_scatter(sel, adv[left]),
            returns=zeros.masked_scatter(sel, ret[left]),
            old_values=zeros.masked_scatter(sel, values[sel]),
        )

    def backward(self, b: TrainBatch, normaliser: float, sums: MutableMapping[str, float]) -> None:
        """The clipped value loss's gradient on one micro-batch; its metrics into `sums`."""
        assert b.old_values is not None and b.returns is not None  # set by `gae_fields`
        values = self._values(b)
        v_loss, v_metrics = critic_objective(
            values.float(),
            b.old_values,
            b.returns,
            b.mask,
            self.ctx.cfg.critic.value_clip,
            self.ctx.cfg.algorithm.loss_agg,
            normaliser,
        )
        v_loss.backward()
        sums["value_loss"] += v_loss.item()
        part_tokens = float(b.mask.sum())
        for k, v in v_metrics.items():
            sums[k] += v * part_tokens

    def idle_backward(self, b: TrainBatch) -> None:
        """A forward and backward that adds nothing (zero weight): a sharded rank with fewer
        micro-batches than another joins the other's all-gathers and reduce-scatters."""
        (self._values(b).sum() * 0.0).backward()

    def step(self, sums: MutableMapping[str, float], tokens: int) -> dict[str, float]:
        """Average over ranks, clip, step; the mini-batch's critic metrics (taken from
        `sums`)."""
        grad_hook = self.ctx.ranks.grad_hook
        if grad_hook is not None:
            grad_hook(list(self.critic.parameters()))
        torch.nn.utils.clip_grad_norm_(
            self.critic.parameters(), self.ctx.cfg.train.max_grad_norm or math.inf
        )
        self.optimizer.step()
        out = {"value_loss": sums.pop("value_loss")}
        for k in ("value_clip_frac", "value_mse"):
            out[k] = sums.pop(k) / max(tokens, 1)
        return out
