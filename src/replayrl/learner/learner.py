"""The learner: recomputes log-probs of stored rollouts and takes clipped policy-gradient steps.

One `train_step` per sampled batch: frozen quantities first (no grad: log pi_k for Mix-PPG's
clip centre, the base / previous policies for KL, critic values for GAE), then `epochs`
passes of shuffled mini-batches, each one optimizer step accumulated over micro-batches.

`Learner` coordinates small parts, each in its own module, over one typed batch
(`batching.TrainBatch`, collated once per step on the learner's device; each mini- and
micro-batch is a row selection of it):
- assembly.py: collation, micro-batches of rollouts sharing prompts, no-grad passes;
- frozen_passes.py: the frozen KL policies, the pi_old refresh, the fields added before the
  updates (with reduced precision, fresh rollouts take log pi_old from the first update's own
  forward when one mini-batch covers the batch, `_fusable`, else from a separate pass);
- policy_pass.py: the policy objective's gradient, diagnostics and optimizer step;
- critic.py: the critic's GAE fields, value loss and optimizer step;
- context.py: the settings every part reads (config, device, precision, other ranks).
What the loss is lives in `algorithms.objective`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence

import numpy as np
import torch
from transformers import PreTrainedModel

from replayrl.algorithms import ADVANTAGES, POLICY_LOSSES, batch_normaliser
from replayrl.algorithms.correction import weight_stats
from replayrl.algorithms.objective import ObjectiveWeights
from replayrl.config.registries import BACKENDS
from replayrl.config.schema import Config, config_value
from replayrl.data.rollout_record import Rollout, is_stale
from replayrl.learner import logprobs
from replayrl.learner.assembly import Assembly, micro_batch
from replayrl.learner.batching import TrainBatch, collate, put_rows, unpad
from replayrl.learner.context import LearnerContext, Ranks
from replayrl.learner.critic import CriticPass, ValueModel
from replayrl.learner.frozen import (
    AdaptersDisabled,
    AdapterSnapshot,
    FrozenPolicy,
    restore_frozen,
)
from replayrl.learner.frozen_passes import FrozenPasses, recompute_behaviour, truncated_is_cap
from replayrl.learner.lr_schedule import StepSchedule
from replayrl.learner.pi_old import PiOld
from replayrl.learner.policy_pass import Accum, PolicyPass
from replayrl.models import precision
from replayrl.models.device import model_device

# re-exported: callers import these from the learner
__all__ = [
    "AdapterSnapshot",
    "AdaptersDisabled",
    "Learner",
    "Ranks",
    "ValueModel",
    "collate",
    "token_logprobs",
    "unpad",
]


# per-token log pi(token) and entropy: completion positions only, the head in chunks
token_logprobs = logprobs.token_logprobs


def _advantage_abs_max(batch: Sequence[Rollout], b: TrainBatch) -> float:
    """The largest |advantage| the loss saw: per token for a critic's estimator (GAE), else
    per rollout (the no-silent-non-training check compares it with the gradient)."""
    token = b.token_advantages
    if token is not None:
        return float(token.abs().max()) if token.numel() else 0.0
    return max((abs(float(r.advantage)) for r in batch), default=0.0)


def _nanmean(values: list[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return float(np.mean(finite)) if finite else math.nan


class Learner:
    """Owns the policy's optimizer, the frozen KL policies, the critic and the version counter."""

    def __init__(
        self,
        model: PreTrainedModel,
        pad_id: int,
        cfg: Config,
        critic: ValueModel | None = None,
    ) -> None:
        self.model = model
        self.pad_id = pad_id
        # batches go where the policy's parameters are (train.device, or the device of a
        # model handed over by the Python API); the critic and frozen copies follow it
        device = model_device(model)
        if critic is not None:
            critic.to(device)
        self.loss_type = POLICY_LOSSES.check(cfg.algorithm.loss_type)
        # precision policy (replayrl/models/precision.py): learner autocast, oneDNN fp32
        # matmuls, and whether fresh rollouts get log pi_old recomputed in the learner's own
        # precision
        if cfg.precision.fast_fp32_matmul:
            precision.enable_fast_fp32_matmul()
        # `auto` resolved by the hardware (bf16 only where native; printed, in summary.json)
        self.precision_choice = precision.choose_for(cfg.precision, model)
        full = cfg.train.logprobs_impl == "full"
        self.ctx = LearnerContext(cfg, device, self.precision_choice.learner_autocast, full)
        backend = BACKENDS.get(cfg.rollout.backend)
        self.recompute_behaviour = recompute_behaviour(cfg, self.precision_choice, backend)
        # on-policy fresh rollouts take log pi_old from the first update's own forward
        # (detached: the same weights, so the same values) instead of a separate no-grad pass
        # (`_fusable` says when); False: always the separate pass (benchmarks, tests)
        self.fuse_behaviour_recompute = True
        self._fused_stats: dict[str, float] = {}
        # the learner's own log pi_old of fresh rollouts, beside them (pi_old.py)
        self.pi_old = PiOld()
        self.tis_cap = truncated_is_cap(cfg, backend, self.recompute_behaviour, self.loss_type)
        self.advantage = ADVANTAGES.get(cfg.algorithm.advantage)
        if self.advantage.needs_critic and critic is None:
            raise ValueError(f"algorithm.advantage={cfg.algorithm.advantage} needs a critic")
        self.assembly = Assembly(self.ctx, pad_id, self.pi_old, self.tis_cap is not None)
        self.policy = PolicyPass(self.ctx, model, self.loss_type, self.advantage)
        self.critic_pass = (
            CriticPass(self.ctx, critic, self.advantage, self.assembly)
            if critic is not None
            else None
        )
        self.frozen = FrozenPasses(
            self.ctx, model, self.assembly, self.pi_old, self.loss_type, self.tis_cap,
            self.critic_pass,
        )  # fmt: skip
        self.version = 0  # policy version: bumped after every training step

    # -- the settings and parts others read ----------------------------------------------------
    @property
    def cfg(self) -> Config:
        return self.ctx.cfg

    @cfg.setter
    def cfg(self, cfg: Config) -> None:
        """A new config (the `auto` design, per-rank mini-batches): every part reads it."""
        self.ctx.cfg = cfg

    @property
    def device(self) -> torch.device:
        return self.ctx.device

    @property
    def autocast(self) -> torch.dtype | None:
        """The learner's autocast dtype (None: none; sharded ranks gather in theirs)."""
        return self.ctx.autocast

    @property
    def full_logprobs(self) -> bool:
        """train.logprobs_impl=full: log-probs from full-vocabulary logits."""
        return self.ctx.full_logprobs

    @property
    def optimizer(self) -> torch.optim.AdamW:
        return self.policy.optimizer

    @property
    def lr_schedule(self) -> StepSchedule:
        return self.policy.lr_schedule

    @property
    def updates(self) -> int:
        """Optimizer steps taken."""
        return self.policy.updates

    @property
    def critic(self) -> ValueModel | None:
        return self.critic_pass.critic if self.critic_pass is not None else None

    @property
    def base_model(self) -> FrozenPolicy | None:
        """pi_base of the KL term (the initial policy, or pi_T after reincarnation)."""
        return self.frozen.base_model

    @base_model.setter
    def base_model(self, frozen: FrozenPolicy | None) -> None:
        self.frozen.base_model = frozen

    @property
    def prev_model(self) -> FrozenPolicy | None:
        """pi_{k-1} of KL-Convex."""
        return self.frozen.prev_model

    def join(self, ranks: Ranks, *, new_parameters: bool = False, autocast: bool = True) -> None:
        """Become one of `ranks.world_size` learner ranks (run/distributed/fsdp_learner.py's
        `join_learners`; every rank at once). `new_parameters`: sharding replaced the policy's
        parameters, so its optimizer and schedule are built anew over them; `autocast=False`:
        the forwards run without autocast (sharded parameters are gathered in the compute
        dtype already, and autocast would only re-cast them)."""
        self.ctx.ranks = ranks
        if new_parameters:
            self.policy.renew_optimizer()
            if self.critic_pass is not None:
                self.critic_pass.renew_optimizer()
        if not autocast:
            self.ctx.autocast = None

    # -- KL bookkeeping ----------------------------------------------------------------------
    def kl_lambda(self, step: int) -> float:
        """Weight on KL to pi_base; 1 - lambda goes to pi_{k-1} (KL-Convex)."""
        return self.frozen.kl_lambda(step)

    def kl_weights(self, step: int) -> tuple[float, float]:
        return self.frozen.kl_weights(step)

    def reincarnate(self) -> None:
        """Policy reincarnation (paper 2): pi_base <- the current policy."""
        self.frozen.reincarnate()

    # -- log-probs and entropies of stored rollouts -------------------------------------------
    def current_logprobs(self, rollouts: Sequence[Rollout]) -> list[torch.Tensor]:
        """Per-token log-probs of each completion under the policy now (no gradient)."""
        return self.assembly.per_rollout(self.model, rollouts)

    def behaviour_logprobs(self, rollouts: Sequence[Rollout]) -> list[torch.Tensor]:
        """Each rollout's log pi_old as the loss sees it: the learner's recomputed values
        where it refreshed them (reduced precision, another engine), else the sampler's."""
        return [self.pi_old.of(r) for r in rollouts]

    def mean_entropies(self, rollouts: Sequence[Rollout]) -> list[float]:
        """Per rollout: the current policy's mean token entropy over its completion (ExGRPO's
        trajectory selection, arXiv 2510.02245 sec. 3.1), no grad."""
        return self.assembly.mean_entropies(self.model, rollouts)

    # -- the step ----------------------------------------------------------------------------
    def train_step(
        self,
        batch: list[Rollout],
        rng: np.random.Generator,
        *,
        step: int = 0,
        epochs: int | None = None,
        policy_frozen: bool = False,
    ) -> dict[str, float]:
        """`epochs` passes over the batch in shuffled mini-batches; returns averaged metrics.

        Rollouts of other weights than the learner's now are stale (`is_stale`: Mix-PPG clips
        them around pi_k / pi_beh); `policy_frozen` trains only the critic (critic warm-up).
        The batch is collated once, on the learner's device; each mini- and micro-batch is a
        selection of its rows.
        """
        cfg = self.cfg
        epochs = epochs or cfg.train.epochs
        stale_flags = [is_stale(r, self.version) for r in batch]
        b, lengths = self.assembly.collate(batch)
        refreshed: dict[str, float] = {}
        fuse: list[int] = []
        if self.recompute_behaviour and not policy_frozen:
            fusable = self._fusable(len(batch))
            refreshed, fuse = self.frozen.refresh(batch, b, lengths, self.version, fusable)
        if fuse:  # rows whose log pi_old the first update's forward sets
            marks = torch.zeros(len(batch), 1, device=self.device)
            marks[fuse] = 1.0
            b = b.replace(fuse=marks * b.mask)
        b = self.frozen.fields(batch, b, lengths, stale_flags, step)
        w_base, w_prev = self.kl_weights(step)
        weights = ObjectiveWeights(
            w_base, w_prev, cfg.algorithm.entropy_coef, cfg.kl.estimator, cfg.algorithm.loss_agg
        )
        knobs = self.loss_knobs()
        mini = cfg.train.mini_batch_size or len(batch)
        self.lr_schedule.set_step(step)
        sums: dict[str, list[float]] = defaultdict(list)
        self._fused_stats = {}
        self.model.train()
        for _ in range(epochs):
            order = rng.permutation(len(batch))
            for start in range(0, len(batch), mini):
                idx = [int(i) for i in order[start : start + mini]]
                update = self._update(batch, b, lengths, idx, weights, knobs, policy_frozen)
                b = b.replace(fuse=None)  # the first update's forward set those log pi_old
                for k, v in update.items():
                    sums[k].append(v)
        if not policy_frozen:
            self.version += 1
        return self._step_metrics(batch, b, sums, step, refreshed)

    def _step_metrics(
        self,
        batch: Sequence[Rollout],
        b: TrainBatch,
        sums: Mapping[str, list[float]],
        step: int,
        refreshed: Mapping[str, float],
    ) -> dict[str, float]:
        """The step's metrics: the updates' averages, the KL coefficients and the terms'
        size, the pi_old refresh's and truncated IS's statistics."""
        w_base, w_prev = self.kl_weights(step)
        out = {k: _nanmean(v) for k, v in sums.items()}
        out.update(kl_lambda=self.kl_lambda(step), kl_coef_base=w_base, kl_coef_prev=w_prev)
        # the KL-Convex terms' size in the loss: coefficient x per-token KL (k3 estimate)
        for name, w in (("base", w_base), ("prev", w_prev)):
            if f"kl_to_{name}" in out:
                out[f"kl_term_{name}"] = w * out[f"kl_to_{name}"]
        out.update(refreshed)
        out.update(self._fused_stats)
        out["advantage_abs_max"] = _advantage_abs_max(batch, b)
        if self.tis_cap is not None and batch:
            assert b.tis_weights is not None
            w_all = b.tis_weights[b.mask.bool()]
            out.update(weight_stats(w_all, torch.ones_like(w_all), self.tis_cap))
        return out

    def _fusable(self, n: int) -> bool:
        """The first update's forward can give fresh rollouts their log pi_old: it covers the
        whole batch before any weight changes (one mini-batch), nothing needs log pi_old
        before that forward (truncated IS weights do), and the forward is deterministic (no
        active dropout, which a separate pass would draw differently anyway)."""
        mini = self.cfg.train.mini_batch_size or n
        if not self.fuse_behaviour_recompute or mini < n or self.tis_cap is not None:
            return False
        return not any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in self.model.modules())

    def loss_knobs(self) -> dict[str, float | None]:
        """The configured loss's knobs, each read from the config key its registry entry
        names. One place, so the training step and the alpha / rho probe
        (learner/grad_probe.py) give a loss the same values."""
        spec = POLICY_LOSSES.get(self.loss_type)
        return {k: config_value(self.cfg, key) for k, key in spec.knobs.items()}

    def normaliser(self, minibatch: Sequence[Rollout]) -> float:
        """The loss denominator of this mini-batch, over all data-parallel ranks."""
        return batch_normaliser(
            self.cfg.algorithm.loss_agg,
            tokens=sum(r.completion_ids.numel() for r in minibatch if self._trained(r)),
            sequences=len(minibatch),
            max_len=self.cfg.rollout.max_new_tokens,
            reduce_sum=self.ctx.ranks.count_reducer,
            world_size=self.ctx.ranks.world_size,
        )

    def _trained(self, rollout: Rollout) -> bool:
        """Whether its tokens enter the policy loss: not a truncated completion under
        `algorithm.mask_truncated_completions` (TRL's option of that name)."""
        return not (self.cfg.algorithm.mask_truncated_completions and rollout.truncated)

    def _update(
        self,
        batch: list[Rollout],
        b: TrainBatch,
        lengths: list[int],
        idx: list[int],
        weights: ObjectiveWeights,
        knobs: Mapping[str, float | None],
        policy_frozen: bool,
    ) -> dict[str, float]:
        """One optimizer step over the mini-batch of rows `idx`, accumulated over
        micro-batches (row selections of the step's padded batch `b`)."""
        minibatch = [batch[i] for i in idx]
        tokens = sum(r.completion_ids.numel() for r in minibatch)
        normaliser = self.normaliser(minibatch)
        self.optimizer.zero_grad(set_to_none=True)
        if self.critic_pass is not None:
            self.critic_pass.optimizer.zero_grad(set_to_none=True)
        acc = Accum()
        fused: dict[int, tuple[Rollout, torch.Tensor]] = {}
        # micro-batches of rollouts sharing prompts: only the gradient's summation order moves
        parts = self.assembly.micro(self.assembly.shared_rows(batch, idx), lengths)
        # agreed first: every rank asks (policy_frozen is the same on every rank), since the
        # critic's passes are collectives too when it is sharded
        idle = self.assembly.idle_micro(parts)
        for part in parts:
            mb = micro_batch(b, part, lengths)
            if not policy_frozen:
                mb = self.policy.backward(mb, weights, knobs, normaliser, acc)
                if mb.fuse is not None and acc.current is not None:
                    self._keep_fused(batch, b, mb, part, acc.current, fused)
            if self.critic_pass is not None:
                self.critic_pass.backward(mb, normaliser, acc.sums)
        for _ in range(idle):  # the busiest rank's passes, in its order, adding nothing
            mb = micro_batch(b, parts[-1], lengths)
            if not policy_frozen:
                self.policy.idle_backward(mb)
            if self.critic_pass is not None:
                self.critic_pass.idle_backward(mb)
        if b.fuse is not None and not policy_frozen:
            # the refreshed log pi_old, as a separate pass would have stored it
            self._fused_stats = self.pi_old.store(
                [r for r, _ in fused.values()], [lp for _, lp in fused.values()]
            )
        out = self.critic_pass.step(acc.sums, tokens) if self.critic_pass is not None else {}
        if policy_frozen:
            return out
        return {**out, **self.policy.step(acc, tokens)}

    @staticmethod
    def _keep_fused(
        batch: Sequence[Rollout],
        b: TrainBatch,
        mb: TrainBatch,
        part: Sequence[int],
        current: torch.Tensor,
        fused: dict[int, tuple[Rollout, torch.Tensor]],
    ) -> None:
        """The fused refresh's log pi_old (and fresh rows' anchor) of micro-batch `mb`, rows
        `part` of `b`: written into `b` for later passes, and kept per fresh rollout."""
        put_rows(b.old_logprobs, part, mb.old_logprobs, mb.mask)
        if b.anchor_logprobs is not None and mb.anchor_logprobs is not None:
            put_rows(b.anchor_logprobs, part, mb.anchor_logprobs, mb.mask)
        assert mb.fuse is not None
        lps = unpad(current, mb.mask)
        for i, lp, f in zip(part, lps, mb.fuse.amax(-1).tolist(), strict=True):
            if f > 0:
                fused.setdefault(id(batch[i]), (batch[i], lp))

    def measure_backward(self, rollouts: list[Rollout]) -> None:
        """A forward+backward pass with no optimizer step (to time training per sample)."""
        if not rollouts:
            return
        b, lengths = self.assembly.collate(rollouts)
        for part in self.assembly.micro(range(len(rollouts)), lengths):
            mb = micro_batch(b, part, lengths)
            logps, _ = self.ctx.logprobs(self.model, mb)
            (-(logps * mb.mask).sum()).backward()
        self.optimizer.zero_grad(set_to_none=True)

    def state_dict(self) -> dict[str, object]:
        state: dict[str, object] = {
            "optimizer": self.optimizer.state_dict(),
            "version": self.version,
            "updates": self.updates,
            "base_model": self.base_model.state_dict() if self.base_model else None,
            "prev_model": self.prev_model.state_dict() if self.prev_model else None,
            "pi_old": self.pi_old.state_dict(),
        }
        if self.critic_pass is not None:
            state["critic"] = self.critic_pass.critic.state_dict()
            state["critic_optimizer"] = self.critic_pass.optimizer.state_dict()
        return state

    def load_state_dict(self, state: dict[str, object]) -> None:
        # None, and no "base_model": a sharded checkpoint's, whose AdamW state and frozen
        # reference are DCP shards each rank loads once sharded (storage/sharded_checkpoint.py)
        if state["optimizer"] is not None:
            self.optimizer.load_state_dict(state["optimizer"])  # type: ignore[arg-type]
        for group in self.optimizer.param_groups:  # the saved groups carry the old run's
            group["weight_decay"] = self.cfg.train.weight_decay  # value: a resume sets it anew
        self.version = int(state["version"])  # type: ignore[call-overload]
        self.policy.updates = int(state["updates"])  # type: ignore[call-overload]
        f = self.frozen
        if "base_model" in state:
            f.base_model = restore_frozen(self.model, f.base_model, state["base_model"])
        f.prev_model = restore_frozen(self.model, f.prev_model, state.get("prev_model"))
        self.pi_old.load_state_dict(state.get("pi_old") or {"sampler": [], "learner": []})  # type: ignore[arg-type]
        if self.critic_pass is not None and "critic" in state:
            # no "critic": a sharded checkpoint's, whose critic is DCP shards as well
            self.critic_pass.critic.load_state_dict(state["critic"])  # type: ignore[arg-type]
            self.critic_pass.optimizer.load_state_dict(state["critic_optimizer"])  # type: ignore[arg-type]
