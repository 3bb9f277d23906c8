"""The learner: recomputes log-probs of stored rollouts and takes clipped policy-gradient steps.

One `train_step` per sampled batch: frozen quantities first (no grad: log pi_k for Mix-PPG's
clip centre, the base / previous policies for KL, critic values for GAE), then `epochs`
passes of shuffled mini-batches, each one optimizer step accumulated over micro-batches.
What the loss is lives in `algorithms.objective`; this module batches, calls it and steps.
The batch is collated once per step, on the learner's device; the frozen fields are added to
that padded batch (as verl keeps `old_log_prob` in its batch), and each mini- and micro-batch
is a row selection of it. Micro-batches group rollouts of the same prompt (the lean forward
runs a shared prompt once), `train.micro_batch_size` rows each or packed by
`train.max_tokens_per_micro_batch`; with reduced precision, fresh rollouts take log pi_old
from the first update's own forward when one mini-batch covers the batch (`_fusable`), else
from a separate no-grad pass, and the learner keeps it beside the rollouts (`pi_old.PiOld`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from transformers import PreTrainedModel

from replayrl.algorithms import ADVANTAGES, POLICY_LOSSES, batch_normaliser, importance_ess
from replayrl.algorithms.aggregation import Reducer
from replayrl.algorithms.correction import apply_token_weights, importance_weights, weight_stats
from replayrl.algorithms.kl import kl_convex_lambda
from replayrl.algorithms.losses import clip_stats
from replayrl.algorithms.objective import ObjectiveWeights, critic_objective, policy_objective
from replayrl.config.registries import BACKENDS, BackendSpec
from replayrl.config.schema import Config, config_value
from replayrl.data.rollout import Rollout, is_stale
from replayrl.learner import logprobs
from replayrl.learner.batching import (
    TrainBatch,
    collate,
    micro_batches,
    put_rows,
    shared_prompt_order,
    token_micro_batches,
    unpad,
)
from replayrl.learner.critic import ValueModel
from replayrl.learner.frozen import (
    AdaptersDisabled,
    AdapterSnapshot,
    FrozenPolicy,
    initial_policy,
    is_lora,
    restore_frozen,
    snapshot,
)
from replayrl.learner.lr_schedule import StepSchedule, warmup_steps
from replayrl.learner.pi_old import PiOld, fresh_rollouts, refresh_counts
from replayrl.models import precision
from replayrl.models.device import model_device

# re-exported: callers import these from the learner
__all__ = [
    "AdapterSnapshot",
    "AdaptersDisabled",
    "Learner",
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


@dataclass
class _Accum:
    """Per-mini-batch sums over micro-batches (token-weighted metrics, ratio diagnostics)."""

    sums: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    ratio_max: float = 0.0
    seq_log_ratios: list[torch.Tensor] = field(default_factory=list)
    ratios: list[torch.Tensor] = field(default_factory=list)
    centres: list[torch.Tensor] = field(default_factory=list)
    stale: list[torch.Tensor] = field(default_factory=list)
    # detached log-probs of the current micro-batch (the fused log pi_old of fresh rollouts)
    current: torch.Tensor | None = None


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
        self.cfg = cfg
        # batches go where the policy's parameters are (train.device, or the device of a
        # model handed over by the Python API); the critic and frozen copies follow it
        self.device = model_device(model)
        if critic is not None:
            critic.to(self.device)
        self.loss_type = POLICY_LOSSES.check(cfg.algorithm.loss_type)
        self.lora = is_lora(model)
        # precision policy (replayrl/models/precision.py): learner autocast, oneDNN fp32
        # matmuls, and whether fresh rollouts get log pi_old recomputed in the learner's own
        # precision
        p = cfg.precision
        if p.fast_fp32_matmul:
            precision.enable_fast_fp32_matmul()
        # `auto` resolved by the hardware (bf16 only where native; printed, in summary.json)
        self.precision_choice = precision.choose_for(p, model)
        self.autocast = self.precision_choice.learner_autocast
        self.full_logprobs = cfg.train.logprobs_impl == "full"
        # sharded ranks (distributed/fsdp.py): every forward is a collective, so a pass that
        # one rank's rows ask for (stale rows' Mix-PPG anchors) runs on every rank
        self.lockstep_forwards = False
        # ... and so is every micro-batch: each rank runs the most micro-batches any rank
        # has (a token budget packs each rank's rows into its own number), idle ones after
        self.micro_count_sync: Callable[[int], int] | None = None
        backend = BACKENDS.get(cfg.rollout.backend)
        self.recompute_behaviour = self._recompute_behaviour(cfg, backend)
        # on-policy fresh rollouts take log pi_old from the first update's own forward
        # (detached: the same weights, so the same values) instead of a separate no-grad pass
        # (`_fusable` says when); False: always the separate pass (benchmarks, tests)
        self.fuse_behaviour_recompute = True
        self._fused_stats: dict[str, float] = {}
        # the learner's own log pi_old of fresh rollouts, beside them (pi_old.py)
        self.pi_old = PiOld()
        self.tis_cap = self._truncated_is_cap(cfg, backend)
        self.importance_mode = cfg.precision.importance_sampling_mode  # TRL's four modes
        # only what trains (with LoRA: the adapters; the base weights are frozen)
        self.optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad],
            lr=cfg.train.lr,
            weight_decay=cfg.train.weight_decay,
        )
        t = cfg.train  # train.lr_scheduler: the lr of each step, set before its updates
        self.lr_schedule = StepSchedule(
            self.optimizer,
            t.lr_scheduler,
            t.steps,
            warmup_steps(t.steps, t.warmup_steps, t.warmup_ratio),
        )
        self.critic = critic
        self.critic_optimizer = (
            torch.optim.AdamW(critic.parameters(), lr=cfg.critic.lr) if critic else None
        )
        self.advantage = ADVANTAGES.get(cfg.algorithm.advantage)
        if self.advantage.needs_critic and critic is None:
            raise ValueError(f"algorithm.advantage={cfg.algorithm.advantage} needs a critic")
        self.version = 0  # policy version: bumped after every training step
        self.updates = 0  # optimizer steps taken
        # data-parallel learners average gradients here before clipping (distributed/ddp.py)
        self.grad_hook: Callable[[list[torch.nn.Parameter]], None] | None = None
        # ... and sum the loss normaliser's count over ranks (token_mean over all ranks' tokens)
        self.count_reducer: Reducer | None = None
        self.world_size = 1
        # frozen policies for the KL terms, kept only while their weight is non-zero
        self.base_model: FrozenPolicy | None = None  # pi_base (initial, or pi_T)
        self.prev_model: FrozenPolicy | None = None  # pi_{k-1}
        if cfg.kl.beta > 0 and self.kl_weights(0)[0] > 0:
            self.base_model = initial_policy(self.model)

    def _recompute_behaviour(self, cfg: Config, backend: BackendSpec) -> bool:
        """Whether fresh rollouts get log pi_old recomputed by the learner: `always`, or
        `auto` where generation and training differ in precision or kernels."""
        gen = self.precision_choice.generation
        reduced = self.autocast is not None or (gen is not None and gen != torch.float32)
        reduced = reduced or (gen is None and cfg.model.dtype != "float32")
        # a backend with its own kernels (vLLM): its log-probs are never the learner's, so the
        # learner recomputes log pi_old and corrects for the mismatch
        reduced = reduced or backend.own_logprobs
        mode = cfg.precision.recompute_behaviour_logprobs
        return mode == "always" or (mode == "auto" and reduced)

    def _truncated_is_cap(self, cfg: Config, backend: BackendSpec) -> float | None:
        """C of truncated IS: precision.truncated_is_cap, else the backend's default (vLLM:
        vllm.truncated_is_cap, on as TRL's vllm_importance_sampling_correction) where it
        applies."""
        cap = cfg.precision.truncated_is_cap
        uses_rewards = "rewards" in POLICY_LOSSES.get(self.loss_type).inputs
        default = backend.truncated_is_cap
        if cap is None and default is not None and self.recompute_behaviour and not uses_rewards:
            return default(cfg)
        # truncated IS weighs tokens by pi_learner_old / pi_sampler: both must exist, and the
        # loss must be one that scales with the advantage (correction.apply_token_weights)
        if cap is not None and not self.recompute_behaviour:
            raise ValueError(
                "precision.truncated_is_cap needs the learner's own log pi_old: set "
                "precision.recompute_behaviour_logprobs=always (auto does it only with a "
                "reduced generation or learner precision)"
            )
        if cap is not None and uses_rewards:
            raise ValueError(
                f"precision.truncated_is_cap scales advantages; algorithm.loss_type="
                f"{self.loss_type} does not use them"
            )
        return cap

    # -- KL bookkeeping ----------------------------------------------------------------------
    def kl_lambda(self, step: int) -> float:
        """Weight on KL to pi_base; 1 - lambda goes to pi_{k-1} (KL-Convex)."""
        k = self.cfg.kl
        if k.target == "reference":
            return 1.0
        s = k.schedule
        return kl_convex_lambda(step, s.start, s.every, s.decrement, s.floor)

    def kl_weights(self, step: int) -> tuple[float, float]:
        beta, lam = self.cfg.kl.beta, self.kl_lambda(step)
        return beta * lam, beta * (1 - lam)

    def reincarnate(self) -> None:
        """Policy reincarnation (paper 2): pi_base <- the current policy."""
        if self.cfg.kl.beta > 0:
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

    # -- frozen per-token quantities ---------------------------------------------------------
    def _micro(self, rows: Sequence[int], lengths: Sequence[int]) -> list[list[int]]:
        """`rows` (in order) cut into micro-batches: `train.micro_batch_size` rows each, or
        packed by `train.max_tokens_per_micro_batch` with that row cap."""
        t = self.cfg.train
        if t.max_tokens_per_micro_batch is None:
            slices = micro_batches(len(rows), t.micro_batch_size)
        else:
            slices = token_micro_batches(
                [lengths[i] for i in rows], t.max_tokens_per_micro_batch, t.micro_batch_size
            )
        return [list(rows[sl]) for sl in slices]

    def _frozen(
        self,
        fn: Callable[[TrainBatch], torch.Tensor],
        b: TrainBatch,
        lengths: Sequence[int],
        rows: Sequence[int],
    ) -> torch.Tensor:
        """`fn`'s per-token values of `rows`, run per micro-batch without grad, laid out like
        `b.mask` (zeros off the completion tokens and on other rows)."""
        out = torch.zeros_like(b.mask)
        parts = self._micro(rows, lengths)
        idle = self._idle_micro(parts)  # agreed before any pass: each pass is a collective
        with torch.no_grad():
            for part in parts:
                mb = b.take(part, max(lengths[i] for i in part))
                put_rows(out, part, fn(mb), mb.mask)
            for _ in range(idle):  # the other ranks' extra passes
                fn(b.take(parts[-1], max(lengths[i] for i in parts[-1])))
        return out

    def _idle_micro(self, parts: Sequence[Sequence[int]]) -> int:
        """How many idle micro-batches this rank runs after its own `parts` (sharded ranks:
        as many as the rank with the most has more; 0 otherwise). An idle one repeats the
        last part and its result is dropped: the same collectives, nothing learnt."""
        if self.micro_count_sync is None:
            return 0
        extra = self.micro_count_sync(len(parts)) - len(parts)
        if extra and not parts:
            raise ValueError("a sharded learner rank has no rollouts to run its passes on")
        return extra

    def _logprobs_in(
        self, model: object, b: TrainBatch, lengths: Sequence[int], rows: Sequence[int]
    ) -> torch.Tensor:
        """log `model`(token) of `rows`, in micro-batches of rollouts sharing prompts (the lean
        forward runs each prompt once); `rows` must already be in `shared_prompt_order`."""

        def fn(mb: TrainBatch) -> torch.Tensor:
            return token_logprobs(
                model,
                mb,
                self.cfg.rollout.temperature,
                autocast=self.autocast,
                full=self.full_logprobs,
            )[0]

        return self._frozen(fn, b, lengths, rows)

    def _shared_rows(self, rollouts: Sequence[Rollout], rows: Sequence[int]) -> list[int]:
        """`rows` of `rollouts` reordered so that rows of one prompt are adjacent."""
        return [rows[j] for j in shared_prompt_order([rollouts[i] for i in rows])]

    def _collate(self, rollouts: Sequence[Rollout]) -> tuple[TrainBatch, list[int]]:
        """The padded batch of `rollouts` on the learner's device (log pi_old: the learner's
        refreshed values where it has them), and each row's length."""
        old = [self.pi_old.of(r) for r in rollouts]
        sampler = None
        if self.tis_cap is not None:  # truncated IS weighs pi_old against the sampler
            sampler = [self.pi_old.sampler(r) for r in rollouts]
        b = collate(rollouts, self.pad_id, old, sampler, device=self.device)
        lengths = [r.prompt_ids.numel() + r.completion_ids.numel() for r in rollouts]
        return b, lengths

    def _per_rollout(self, model: object, rollouts: Sequence[Rollout]) -> list[torch.Tensor]:
        """Per-token log-probs of each completion under `model` (no gradient)."""
        if not rollouts:
            return []
        b, lengths = self._collate(rollouts)
        rows = self._shared_rows(rollouts, range(len(rollouts)))
        return unpad(self._logprobs_in(model, b, lengths, rows), b.mask)

    def current_logprobs(self, rollouts: Sequence[Rollout]) -> list[torch.Tensor]:
        """Per-token log-probs of each completion under the policy now (no gradient)."""
        return self._per_rollout(self.model, rollouts)

    def mean_entropies(self, rollouts: Sequence[Rollout]) -> list[float]:
        """Per rollout: the current policy's mean token entropy over its completion (ExGRPO's
        trajectory selection, arXiv 2510.02245 sec. 3.1), no grad."""

        def fn(mb: TrainBatch) -> torch.Tensor:
            return token_logprobs(
                self.model,
                mb,
                self.cfg.rollout.temperature,
                autocast=self.autocast,
                full=self.full_logprobs,
            )[1]

        if not rollouts:
            return []
        b, lengths = self._collate(rollouts)
        ent = self._frozen(fn, b, lengths, range(len(rollouts)))
        return [float(e.mean()) if e.numel() else 0.0 for e in unpad(ent, b.mask)]

    def _gae_fields(
        self, rollouts: Sequence[Rollout], b: TrainBatch, lengths: Sequence[int]
    ) -> TrainBatch:
        """Critic values of the batch, then the registered token estimator's advantages and
        returns per token (gae: whitened GAE, `algorithm.advantage`), added to `b`."""
        assert self.critic is not None and self.advantage.token is not None
        self.critic.eval()
        critic = self.critic

        def critic_values(mb: TrainBatch) -> torch.Tensor:
            with precision.autocast(self.autocast, self.device):  # as the policy runs
                return critic(mb).float()

        values = self._frozen(critic_values, b, lengths, range(len(rollouts)))
        self.critic.train()
        # the estimator runs along each completion: its tokens left-aligned, [n, longest]
        comp = torch.tensor([r.completion_ids.numel() for r in rollouts], device=self.device)
        width = int(comp.max())
        msk = (torch.arange(width, device=self.device)[None, :] < comp[:, None]).float()
        sel, left = b.mask.bool(), msk.bool()
        val = torch.zeros_like(msk).masked_scatter(left, values[sel])
        rew = torch.zeros_like(msk)
        rows = torch.arange(len(rollouts), device=self.device)
        has = comp > 0
        rewards = torch.tensor([r.reward for r in rollouts], device=self.device)
        rew[rows[has], comp[has] - 1] = rewards[has]  # outcome reward on the last token
        adv, ret = self.advantage.token(rew, val, msk, self.cfg.critic.gamma, self.cfg.critic.lam)
        zeros = torch.zeros_like(b.mask)
        return b.replace(
            token_advantages=zeros.masked_scatter(sel, adv[left]),
            returns=zeros.masked_scatter(sel, ret[left]),
            old_values=zeros.masked_scatter(sel, values[sel]),
        )

    def _frozen_fields(
        self,
        batch: list[Rollout],
        b: TrainBatch,
        lengths: list[int],
        stale: list[bool],
        step: int,
    ) -> TrainBatch:
        """Everything computed once per batch without grad, added to its padded batch `b`."""
        rows = self._shared_rows(batch, range(len(batch)))
        stale_rows = torch.tensor(stale, dtype=torch.bool, device=self.device)[:, None]
        anchors = "anchor_logprobs" in POLICY_LOSSES.get(self.loss_type).inputs
        if anchors and (any(stale) or self.lockstep_forwards):
            current = self._logprobs_in(self.model, b, lengths, rows)
            # fresh data: c = pi_k / pi_beh = 1 exactly (plain PPO clipping)
            b = b.replace(anchor_logprobs=torch.where(stale_rows, current, b.old_logprobs))
        w_base, w_prev = self.kl_weights(step)
        if w_base > 0:
            if self.base_model is None:
                self.base_model = initial_policy(self.model)
            b = b.replace(base_logprobs=self._logprobs_in(self.base_model, b, lengths, rows))
        if w_prev > 0:
            if self.prev_model is None:  # first use: pi_{k-1} unknown, start from pi_k
                self.prev_model = snapshot(self.model)
            b = b.replace(prev_logprobs=self._logprobs_in(self.prev_model, b, lengths, rows))
        self._refresh_frozen(step, w_base)
        if self.advantage.needs_critic:
            b = self._gae_fields(batch, b, lengths)
        b = b.replace(stale=stale_rows.float() * b.mask)
        if self.tis_cap is not None:
            # learner log pi_old (refreshed) vs the sampler's; a rollout never refreshed
            # (stale at its first use) has only the sampler's: weight 1
            assert b.sampler_logprobs is not None
            weights = self._is_weights(b.old_logprobs, b.sampler_logprobs, b)
            b = b.replace(tis_weights=weights, sampler_logprobs=None)
        return b

    def _is_weights(
        self, learner_lp: torch.Tensor, sampler_lp: torch.Tensor, b: TrainBatch
    ) -> torch.Tensor:
        """Per-token importance weights of the padded batch under
        `precision.importance_sampling_mode` (zero off the completion tokens)."""
        assert self.tis_cap is not None
        mask = b.mask.bool()
        w = torch.zeros_like(b.mask)
        if self.importance_mode.startswith("token"):  # per token: every row's tokens at once
            w[mask] = importance_weights(
                learner_lp[mask], sampler_lp[mask], self.tis_cap, self.importance_mode
            ).to(w.dtype)
            return w
        for i in range(mask.shape[0]):  # a sequence mode needs each row's own tokens
            m = mask[i]
            w[i, m] = importance_weights(
                learner_lp[i, m], sampler_lp[i, m], self.tis_cap, self.importance_mode
            ).to(w.dtype)
        return w

    def _refresh(
        self, batch: list[Rollout], b: TrainBatch, lengths: list[int], epochs: int
    ) -> tuple[dict[str, float], list[int]]:
        """Reduced precision: fresh rollouts get log pi_old from the learner itself, by a
        no-grad pass now, or by the first update's own forward (the rows returned)."""
        counts = refresh_counts(batch, self.version, self.pi_old)
        fresh = fresh_rollouts(batch, self.version, self.pi_old)
        if not fresh and not self.lockstep_forwards:
            return counts, []
        ids = {id(r) for r in fresh}
        rows = [i for i, r in enumerate(batch) if id(r) in ids]
        if self._fusable(len(batch), epochs):
            return counts, rows
        first: dict[int, int] = {}  # a rollout twice in the batch is computed once
        for i in rows:
            first.setdefault(id(batch[i]), i)
        keep = sorted(first.values())
        # sharded ranks hold as many rollouts each but other fresh ones (or none): each
        # passes its whole batch, so all run the same micro-batches
        passed = list(range(len(batch))) if self.lockstep_forwards else keep
        lp = self._logprobs_in(self.model, b, lengths, self._shared_rows(batch, passed))
        if not keep:
            return counts, []
        src = torch.tensor([first[id(batch[i])] for i in rows], device=self.device)
        dst = torch.tensor(rows, device=self.device)
        b.old_logprobs[dst] = torch.where(b.mask[dst].bool(), lp[src], b.old_logprobs[dst])
        stats = self.pi_old.store([batch[i] for i in keep], unpad(lp[keep], b.mask[keep]))
        return {**counts, **stats}, []

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
        b, lengths = self._collate(batch)
        refreshed: dict[str, float] = {}
        fuse: list[int] = []
        if self.recompute_behaviour and not policy_frozen:
            refreshed, fuse = self._refresh(batch, b, lengths, epochs)
        if fuse:  # rows whose log pi_old the first update's forward sets
            marks = torch.zeros(len(batch), 1, device=self.device)
            marks[fuse] = 1.0
            b = b.replace(fuse=marks * b.mask)
        b = self._frozen_fields(batch, b, lengths, stale_flags, step)
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

    def _fusable(self, n: int, epochs: int) -> bool:
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
            reduce_sum=self.count_reducer,
            world_size=self.world_size,
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
        if self.critic_optimizer is not None:
            self.critic_optimizer.zero_grad(set_to_none=True)
        acc = _Accum()
        fused: dict[int, tuple[Rollout, torch.Tensor]] = {}
        # micro-batches of rollouts sharing prompts: only the gradient's summation order moves
        parts = self._micro(self._shared_rows(batch, idx), lengths)
        idle = self._idle_micro(parts) if not policy_frozen else 0  # agreed before any pass
        for part in parts:
            mb = b.take(part, max(lengths[i] for i in part))
            if not policy_frozen:
                mb = self._policy_backward(mb, weights, knobs, normaliser, acc)
                if mb.fuse is not None and acc.current is not None:
                    # the refreshed log pi_old (and fresh rows' anchor) for later passes
                    put_rows(b.old_logprobs, part, mb.old_logprobs, mb.mask)
                    if b.anchor_logprobs is not None and mb.anchor_logprobs is not None:
                        put_rows(b.anchor_logprobs, part, mb.anchor_logprobs, mb.mask)
                    lps = unpad(acc.current, mb.mask)
                    for i, lp, f in zip(part, lps, mb.fuse.amax(-1).tolist(), strict=True):
                        if f > 0:
                            fused.setdefault(id(batch[i]), (batch[i], lp))
            if self.critic is not None:
                self._critic_backward(mb, normaliser, acc)
        for _ in range(idle):
            self._idle_backward(b.take(parts[-1], max(lengths[i] for i in parts[-1])))
        if b.fuse is not None and not policy_frozen:
            # the refreshed log pi_old, as a separate pass would have stored it
            self._fused_stats = self.pi_old.store(
                [r for r, _ in fused.values()], [lp for _, lp in fused.values()]
            )
        out = self._critic_step(acc, tokens) if self.critic is not None else {}
        if policy_frozen:
            return out
        return {**out, **self._policy_step(acc, tokens)}

    def _policy_backward(
        self,
        b: TrainBatch,
        w: ObjectiveWeights,
        knobs: Mapping[str, float | None],
        normaliser: float,
        acc: _Accum,
    ) -> TrainBatch:
        """The objective's gradient on one micro-batch, and its diagnostics into `acc`;
        returns the micro-batch as the loss saw it (a fused refresh sets log pi_old)."""
        mask = b.mask
        logps, entropy = token_logprobs(
            self.model,
            b,
            self.cfg.rollout.temperature,
            entropy_grad=w.entropy_coef > 0,
            autocast=self.autocast,
            full=self.full_logprobs,
        )
        if b.fuse is not None:
            # fused refresh: log pi_old = log pi_theta (detached) on fresh rollouts' tokens,
            # so their ratio is exactly 1 and the gradient that of the on-policy objective
            current = logps.detach()
            acc.current = current
            f = b.fuse.bool()
            anchor = b.anchor_logprobs  # fresh data: c = pi_k / pi_beh = 1
            b = b.replace(
                old_logprobs=torch.where(f, current, b.old_logprobs),
                anchor_logprobs=torch.where(f, current, anchor) if anchor is not None else None,
            )
        adv = b.token_advantages if not self.advantage.at_generation else b.advantages
        assert adv is not None  # a critic's estimator adds token_advantages
        if b.tis_weights is not None:  # truncated IS: w * loss_t == loss_t with w * A_t
            adv = apply_token_weights(adv, b.tis_weights)
        inputs = b.loss_inputs()
        loss_mask = mask
        if self.cfg.algorithm.mask_truncated_completions:
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
            inputs,
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
            self._diagnostics(b, logps, entropy, acc)
        part_tokens = float(mask.sum())
        for k, v in terms.metrics.items():  # token-weighted average over micro-batches
            if k == "ratio_max":
                acc.ratio_max = max(acc.ratio_max, v)
            else:
                acc.sums[k] += v * part_tokens
        return b

    def _idle_backward(self, b: TrainBatch) -> None:
        """A forward and backward that adds nothing (zero weight): a sharded rank with fewer
        micro-batches than another joins the other's all-gathers and reduce-scatters."""
        logps, _ = token_logprobs(
            self.model,
            b,
            self.cfg.rollout.temperature,
            autocast=self.autocast,
            full=self.full_logprobs,
        )
        (logps.sum() * 0.0).backward()

    @staticmethod
    def _diagnostics(
        b: TrainBatch, logps: torch.Tensor, entropy: torch.Tensor, acc: _Accum
    ) -> None:
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

    def _critic_backward(self, b: TrainBatch, normaliser: float, acc: _Accum) -> None:
        assert self.critic is not None
        c, mask = self.cfg.critic, b.mask
        with precision.autocast(self.autocast, self.device):  # as the policy runs
            values = self.critic(b)
        assert b.old_values is not None and b.returns is not None  # set by `_gae_fields`
        v_loss, v_metrics = critic_objective(
            values.float(),
            b.old_values,
            b.returns,
            mask,
            c.value_clip,
            self.cfg.algorithm.loss_agg,
            normaliser,
        )
        v_loss.backward()
        acc.sums["value_loss"] += v_loss.item()
        part_tokens = float(mask.sum())
        for k, v in v_metrics.items():
            acc.sums[k] += v * part_tokens

    def _critic_step(self, acc: _Accum, tokens: int) -> dict[str, float]:
        assert self.critic is not None and self.critic_optimizer is not None
        if self.grad_hook is not None:
            self.grad_hook(list(self.critic.parameters()))
        torch.nn.utils.clip_grad_norm_(
            self.critic.parameters(), self.cfg.train.max_grad_norm or math.inf
        )
        self.critic_optimizer.step()
        out = {"value_loss": acc.sums.pop("value_loss")}
        for k in ("value_clip_frac", "value_mse"):
            out[k] = acc.sums.pop(k) / max(tokens, 1)
        return out

    def _policy_step(self, acc: _Accum, tokens: int) -> dict[str, float]:
        """Clip, step (or skip a non-finite gradient), and the mini-batch's metrics."""
        max_norm = self.cfg.train.max_grad_norm
        if self.grad_hook is not None:  # every rank, same parameter order
            self.grad_hook([p for p in self.model.parameters() if p.requires_grad])
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
        a = self.cfg.algorithm
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

    def measure_backward(self, rollouts: list[Rollout]) -> None:
        """A forward+backward pass with no optimizer step (to time training per sample)."""
        if not rollouts:
            return
        b, lengths = self._collate(rollouts)
        for part in self._micro(range(len(rollouts)), lengths):
            mb = b.take(part, max(lengths[i] for i in part))
            logps, _ = token_logprobs(
                self.model,
                mb,
                self.cfg.rollout.temperature,
                autocast=self.autocast,
                full=self.full_logprobs,
            )
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
        if self.critic is not None and self.critic_optimizer is not None:
            state["critic"] = self.critic.state_dict()
            state["critic_optimizer"] = self.critic_optimizer.state_dict()
        return state

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])  # type: ignore[arg-type]
        for group in self.optimizer.param_groups:  # the saved groups carry the old run's
            group["weight_decay"] = self.cfg.train.weight_decay  # value: a resume sets it anew
        self.version = int(state["version"])  # type: ignore[call-overload]
        self.updates = int(state["updates"])  # type: ignore[call-overload]
        self.base_model = restore_frozen(self.model, self.base_model, state.get("base_model"))
        self.prev_model = restore_frozen(self.model, self.prev_model, state.get("prev_model"))
        self.pi_old.load_state_dict(state.get("pi_old") or {"sampler": [], "learner": []})  # type: ignore[arg-type]
        if self.critic is not None and self.critic_optimizer is not None:
            self.critic.load_state_dict(state["critic"])  # type: ignore[arg-type]
            self.critic_optimizer.load_state_dict(state["critic_optimizer"])  # type: ignore[arg-type]
