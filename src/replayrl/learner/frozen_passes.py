"""The learner's frozen passes: everything computed once per step without grad, before the
updates, and added to the step's padded batch (as verl keeps `old_log_prob` in its batch).

- log pi_old of fresh rollouts, recomputed by the learner with reduced precision (pi_old.py):
  by a no-grad pass now, or by the first update's own forward (the rows `refresh` returns);
- log pi_k for Mix-PPG's clip centre on stale rows;
- log pi_base and log pi_{k-1} for the KL-Convex terms, with the frozen policies kept only
  while their weight is non-zero (and pi_{k-1} <- pi_k after each step that needs it);
- the critic's values and per-token advantages (critic.py);
- the `stale` marks and truncated importance-sampling weights.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from replayrl.algorithms import POLICY_LOSSES
from replayrl.algorithms.correction import importance_weights
from replayrl.algorithms.kl import kl_convex_lambda
from replayrl.config.registries import BackendSpec
from replayrl.config.schema import Config
from replayrl.data.rollout_record import Rollout
from replayrl.learner.assembly import Assembly
from replayrl.learner.batching import TrainBatch, unpad
from replayrl.learner.context import LearnerContext
from replayrl.learner.critic import CriticPass
from replayrl.learner.frozen import FrozenPolicy, initial_policy, snapshot
from replayrl.learner.pi_old import PiOld, fresh_rollouts, refresh_counts
from replayrl.models.precision import PrecisionChoice


def recompute_behaviour(cfg: Config, choice: PrecisionChoice, backend: BackendSpec) -> bool:
    """Whether fresh rollouts get log pi_old recomputed by the learner: `always`, or
    `auto` where generation and training differ in precision or kernels."""
    gen = choice.generation
    reduced = choice.learner_autocast is not None or (gen is not None and gen != torch.float32)
    reduced = reduced or (gen is None and cfg.model.dtype != "float32")
    # a backend with its own kernels (vLLM): its log-probs are never the learner's, so the
    # learner recomputes log pi_old and corrects for the mismatch
    reduced = reduced or backend.own_logprobs
    mode = cfg.precision.recompute_behaviour_logprobs
    return mode == "always" or (mode == "auto" and reduced)


def truncated_is_cap(
    cfg: Config, backend: BackendSpec, recompute: bool, loss_type: str
) -> float | None:
    """C of truncated IS: precision.truncated_is_cap, else the backend's default (vLLM:
    vllm.truncated_is_cap, on as TRL's vllm_importance_sampling_correction) where it
    applies."""
    cap = cfg.precision.truncated_is_cap
    uses_rewards = "rewards" in POLICY_LOSSES.get(loss_type).inputs
    default = backend.truncated_is_cap
    if cap is None and default is not None and recompute and not uses_rewards:
        return default(cfg)
    # truncated IS weighs tokens by pi_learner_old / pi_sampler: both must exist, and the
    # loss must be one that scales with the advantage (correction.apply_token_weights)
    if cap is not None and not recompute:
        raise ValueError(
            "precision.truncated_is_cap needs the learner's own log pi_old: set "
            "precision.recompute_behaviour_logprobs=always (auto does it only with a "
            "reduced generation or learner precision)"
        )
    if cap is not None and uses_rewards:
        raise ValueError(
            f"precision.truncated_is_cap scales advantages; algorithm.loss_type="
            f"{loss_type} does not use them"
        )
    return cap


class FrozenPasses:
    """The frozen KL policies (pi_base, pi_{k-1}) and the no-grad passes of a step."""

    def __init__(
        self,
        ctx: LearnerContext,
        model: torch.nn.Module,
        assembly: Assembly,
        pi_old: PiOld,
        loss_type: str,
        tis_cap: float | None,
        critic: CriticPass | None,
    ) -> None:
        self.ctx, self.model, self.assembly, self.pi_old = ctx, model, assembly, pi_old
        self.loss_type, self.tis_cap, self.critic = loss_type, tis_cap, critic
        self.importance_mode = ctx.cfg.precision.importance_sampling_mode  # TRL's four modes
        # frozen policies for the KL terms, kept only while their weight is non-zero
        self.base_model: FrozenPolicy | None = None  # pi_base (initial, or pi_T)
        self.prev_model: FrozenPolicy | None = None  # pi_{k-1}
        if ctx.cfg.kl.beta > 0 and self.kl_weights(0)[0] > 0:
            self.base_model = initial_policy(model)

    # -- KL bookkeeping ----------------------------------------------------------------------
    def kl_lambda(self, step: int) -> float:
        """Weight on KL to pi_base; 1 - lambda goes to pi_{k-1} (KL-Convex)."""
        k = self.ctx.cfg.kl
        if k.target == "reference":
            return 1.0
        s = k.schedule
        return kl_convex_lambda(step, s.start, s.every, s.decrement, s.floor)

    def kl_weights(self, step: int) -> tuple[float, float]:
        beta, lam = self.ctx.cfg.kl.beta, self.kl_lambda(step)
        return beta * lam, beta * (1 - lam)

    def reincarnate(self) -> None:
        """Policy reincarnation (paper 2): pi_base <- the current policy."""
        if self.ctx.cfg.kl.beta > 0:
            self.base_model = snapshot(self.model)

    def _refresh_frozen(self, step: int, w_base: float) -> None:
        """After this step's frozen log-probs: pi_{k-1} <- pi_k if the next step needs it;
        drop frozen policies whose weight is zero from now on."""
        if self.kl_weights(step + 1)[1] > 0:  # next step needs pi_{k-1} = this pi_k
            if self.prev_model is None:
                self.prev_model = snapshot(self.model)
            else:
                self.prev_model.load_state_dict(self.model.state_dict())
        else:
            self.prev_model = None
        if w_base == 0 and self.kl_weights(step + 1)[0] == 0:
            self.base_model = None

    # -- the step's fields -------------------------------------------------------------------
    def fields(
        self,
        batch: Sequence[Rollout],
        b: TrainBatch,
        lengths: Sequence[int],
        stale: Sequence[bool],
        step: int,
    ) -> TrainBatch:
        """Everything computed once per batch without grad, added to its padded batch `b`."""
        logprobs_in = self.assembly.logprobs_in
        rows = self.assembly.shared_rows(batch, range(len(batch)))
        stale_rows = torch.tensor(stale, dtype=torch.bool, device=self.ctx.device)[:, None]
        anchors = "anchor_logprobs" in POLICY_LOSSES.get(self.loss_type).inputs
        if anchors and (any(stale) or self.ctx.ranks.lockstep_forwards):
            current = logprobs_in(self.model, b, lengths, rows)
            # fresh data: c = pi_k / pi_beh = 1 exactly (plain PPO clipping)
            b = b.replace(anchor_logprobs=torch.where(stale_rows, current, b.old_logprobs))
        w_base, w_prev = self.kl_weights(step)
        if w_base > 0:
            if self.base_model is None:
                self.base_model = initial_policy(self.model)
            b = b.replace(base_logprobs=logprobs_in(self.base_model, b, lengths, rows))
        if w_prev > 0:
            if self.prev_model is None:  # first use: pi_{k-1} unknown, start from pi_k
                self.prev_model = snapshot(self.model)
            b = b.replace(prev_logprobs=logprobs_in(self.prev_model, b, lengths, rows))
        self._refresh_frozen(step, w_base)
        if self.critic is not None and self.critic.advantage.needs_critic:
            b = self.critic.gae_fields(batch, b, lengths)
        b = b.replace(stale=stale_rows.float() * b.mask)
        if self.tis_cap is not None:
            # learner log pi_old (refreshed) vs the sampler's; a rollout never refreshed
            # (stale at its first use) has only the sampler's: weight 1
            assert b.sampler_logprobs is not None
            weights = self.is_weights(b.old_logprobs, b.sampler_logprobs, b.mask)
            b = b.replace(tis_weights=weights, sampler_logprobs=None)
        return b

    def is_weights(
        self, learner_lp: torch.Tensor, sampler_lp: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        """Per-token importance weights of the padded batch under
        `precision.importance_sampling_mode` (zero off the completion tokens)."""
        assert self.tis_cap is not None
        w = torch.zeros_like(mask)
        sel = mask.bool()
        if self.importance_mode.startswith("token"):  # per token: every row's tokens at once
            w[sel] = importance_weights(
                learner_lp[sel], sampler_lp[sel], self.tis_cap, self.importance_mode
            ).to(w.dtype)
            return w
        for i in range(sel.shape[0]):  # a sequence mode needs each row's own tokens
            m = sel[i]
            w[i, m] = importance_weights(
                learner_lp[i, m], sampler_lp[i, m], self.tis_cap, self.importance_mode
            ).to(w.dtype)
        return w

    # -- log pi_old of fresh rollouts --------------------------------------------------------
    def refresh(
        self,
        batch: Sequence[Rollout],
        b: TrainBatch,
        lengths: Sequence[int],
        version: int,
        fusable: bool,
    ) -> tuple[dict[str, float], list[int]]:
        """Reduced precision: fresh rollouts (of the weights `version`) get log pi_old from
        the learner itself, by a no-grad pass now (written into `b.old_logprobs`), or, where
        `fusable`, by the first update's own forward (the rows returned)."""
        counts = refresh_counts(batch, version, self.pi_old)
        fresh = fresh_rollouts(batch, version, self.pi_old)
        lockstep = self.ctx.ranks.lockstep_forwards
        if not fresh and not lockstep:
            return counts, []
        ids = {id(r) for r in fresh}
        rows = [i for i, r in enumerate(batch) if id(r) in ids]
        if fusable:
            return counts, rows
        first: dict[int, int] = {}  # a rollout twice in the batch is computed once
        for i in rows:
            first.setdefault(id(batch[i]), i)
        keep = sorted(first.values())
        # sharded ranks hold as many rollouts each but other fresh ones (or none): each
        # passes its whole batch, so all run the same micro-batches
        passed = list(range(len(batch))) if lockstep else keep
        lp = self.assembly.logprobs_in(
            self.model, b, lengths, self.assembly.shared_rows(batch, passed)
        )
        if not keep:
            return counts, []
        src = torch.tensor([first[id(batch[i])] for i in rows], device=self.ctx.device)
        dst = torch.tensor(rows, device=self.ctx.device)
        b.old_logprobs[dst] = torch.where(b.mask[dst].bool(), lp[src], b.old_logprobs[dst])
        stats = self.pi_old.store([batch[i] for i in keep], unpad(lp[keep], b.mask[keep]))
        return {**counts, **stats}, []
