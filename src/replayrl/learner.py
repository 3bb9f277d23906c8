"""The learner: recomputes log-probs of stored rollouts and takes clipped policy-gradient steps.

One `train_step` per sampled batch: frozen quantities first (no grad: log pi_k for Mix-PPG's
clip centre, the base / previous policies for KL, critic values for GAE), then `epochs`
passes of shuffled mini-batches, each one optimizer step accumulated over micro-batches.
"""

from __future__ import annotations

import copy
import math
from collections import defaultdict
from collections.abc import Callable, Sequence

import numpy as np
import torch
from transformers import AutoModel, PreTrainedModel

from replayrl.algorithms import get_policy_loss, importance_ess
from replayrl.algorithms.advantages import gae
from replayrl.algorithms.kl import kl_convex, kl_convex_lambda
from replayrl.algorithms.losses import aggregate, clip_stats, clipped_value_loss
from replayrl.config import Config
from replayrl.rollout import Rollout

TokenFields = dict[str, Sequence[torch.Tensor]]


def collate(
    rollouts: Sequence[Rollout], pad_id: int, token_fields: TokenFields | None = None
) -> dict[str, torch.Tensor]:
    """Right-padded [prompt + completion] rows; `mask` marks completion tokens of `targets`.

    Per-token fields (behaviour log-probs, and any `token_fields`: one 1-D tensor per rollout
    over its completion tokens) are laid out like `mask`.
    """
    lengths = [r.prompt_ids.numel() + r.completion_ids.numel() for r in rollouts]
    width = max(lengths)
    n = len(rollouts)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    attn = torch.zeros((n, width), dtype=torch.long)
    mask = torch.zeros((n, width - 1), dtype=torch.float32)
    fields = {"old_logprobs": [r.behaviour_logprobs for r in rollouts], **(token_fields or {})}
    placed = {k: torch.zeros((n, width - 1), dtype=torch.float32) for k in fields}
    for i, r in enumerate(rollouts):
        p, c = r.prompt_ids.numel(), r.completion_ids.numel()
        ids[i, :p] = r.prompt_ids
        ids[i, p : p + c] = r.completion_ids
        attn[i, : p + c] = 1
        # the token at position t is predicted by logits at t-1
        mask[i, p - 1 : p - 1 + c] = 1
        for k, values in fields.items():
            placed[k][i, p - 1 : p - 1 + c] = values[i]
    return {
        "input_ids": ids,
        "attention_mask": attn,
        "mask": mask,
        **placed,
        "advantages": torch.tensor([r.advantage for r in rollouts], dtype=torch.float32),
        "rewards": torch.tensor([r.reward for r in rollouts], dtype=torch.float32),
        "baselines": torch.tensor([r.group_mean_reward for r in rollouts], dtype=torch.float32),
    }


def unpad(tokens: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
    """Per-row 1-D tensors of the masked (completion) positions."""
    return [row[m.bool()].detach().clone() for row, m in zip(tokens, mask, strict=True)]


def token_logprobs(
    model: PreTrainedModel,
    batch: dict[str, torch.Tensor],
    temperature: float,
    entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log pi(token) under logits / temperature, and the per-token entropy."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    logits = logits[:, :-1].float() / temperature
    logps = torch.log_softmax(logits, dim=-1)
    targets = batch["input_ids"][:, 1:]
    token_logps = logps.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        entropy = -(logps.exp() * logps).sum(-1)
    return token_logps, entropy


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

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """V(state before each target token), laid out like `mask`."""
        hidden = self.backbone(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]
        ).last_hidden_state
        return self.head(hidden[:, :-1].float()).squeeze(-1)


def _frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    clone = copy.deepcopy(model)
    clone.eval()
    for p in clone.parameters():
        p.requires_grad_(False)
    return clone


def _is_lora(model: torch.nn.Module) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "disable_adapter")


class _EvalForward:
    """Runs the shared policy module in eval mode (no dropout) and restores its mode."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def _forward(self, **kwargs):
        raise NotImplementedError

    def __call__(self, **kwargs):
        was_training = self.model.training
        self.model.eval()
        try:
            return self._forward(**kwargs)
        finally:
            self.model.train(was_training)


ADAPTERS_DISABLED = "adapters_disabled"  # checkpoint marker for the LoRA reference


class AdaptersDisabled(_EvalForward):
    """pi_base of a LoRA policy: the policy module itself with its adapters switched off.

    LoRA starts with B = 0, so this is the initial policy, exactly, with no second copy of
    the model; the base weights never train, so it stays that.
    """

    def _forward(self, **kwargs):
        with self.model.disable_adapter():
            return self.model(**kwargs)

    def state_dict(self) -> str:
        return ADAPTERS_DISABLED

    def load_state_dict(self, state: object) -> None:
        pass


class AdapterSnapshot(_EvalForward):
    """A frozen LoRA policy: a copy of the adapter weights only (pi_{k-1} for KL-Convex, a
    reincarnated pi_base), evaluated through the policy module with `functional_call`."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__(model)
        self.tensors = {
            n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad
        }

    def _forward(self, **kwargs):
        return torch.func.functional_call(self.model, self.tensors, args=(), kwargs=kwargs)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.tensors

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Copy the adapter weights from `state` (an adapter snapshot or the policy's own)."""
        with torch.no_grad():
            for name, t in self.tensors.items():
                t.copy_(state[name])


def whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / std over masked entries (PPO advantage normalisation)."""
    m = mask.bool()
    vals = x[m]
    if vals.numel() < 2:
        return x * mask
    return ((x - vals.mean()) / (vals.std() + eps)) * mask


def _nanmean(values: list[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return float(np.mean(finite)) if finite else math.nan


FrozenPolicy = torch.nn.Module | AdaptersDisabled | AdapterSnapshot


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
        self.loss_fn = get_policy_loss(cfg.algorithm.loss_type)
        self.lora = _is_lora(model)
        # only what trains (with LoRA: the adapters; the base weights are frozen)
        self.optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad],
            lr=cfg.train.lr,
            weight_decay=cfg.train.weight_decay,
        )
        self.critic = critic
        self.critic_optimizer = (
            torch.optim.AdamW(critic.parameters(), lr=cfg.critic.lr) if critic else None
        )
        if cfg.algorithm.advantage == "gae" and critic is None:
            raise ValueError("algorithm.advantage=gae needs a critic")
        self.version = 0  # policy version: bumped after every training step
        self.updates = 0  # optimizer steps taken
        # data-parallel learners average gradients here before clipping (distributed/ddp.py)
        self.grad_hook: Callable[[list[torch.nn.Parameter]], None] | None = None
        # frozen policies for the KL terms, kept only while their weight is non-zero
        self.base_model: FrozenPolicy | None = None  # pi_base (initial, or pi_T)
        self.prev_model: FrozenPolicy | None = None  # pi_{k-1}
        if cfg.kl.beta > 0 and self.kl_weights(0)[0] > 0:
            self.base_model = self._new_base()

    # -- frozen policies -----------------------------------------------------------------
    # Full fine-tuning keeps frozen deep copies. With LoRA the initial policy is the base
    # model with the adapters disabled (no copy at all), and any later frozen policy
    # (pi_{k-1}, a reincarnated pi_base) is a copy of the adapter weights only.
    def _new_base(self):
        return AdaptersDisabled(self.model) if self.lora else _frozen_copy(self.model)

    def _freeze_current(self):
        return AdapterSnapshot(self.model) if self.lora else _frozen_copy(self.model)

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
            self.base_model = self._freeze_current()

    def _per_rollout(
        self, model: torch.nn.Module, rollouts: Sequence[Rollout]
    ) -> list[torch.Tensor]:
        out: list[torch.Tensor] = []
        micro = self.cfg.train.micro_batch_size
        with torch.no_grad():
            for start in range(0, len(rollouts), micro):
                b = collate(rollouts[start : start + micro], self.pad_id)
                logps, _ = token_logprobs(model, b, self.cfg.rollout.temperature)
                out.extend(unpad(logps, b["mask"]))
        return out

    def _gae_fields(self, rollouts: Sequence[Rollout]) -> TokenFields:
        """Critic values of the batch, GAE advantages (whitened) and returns, per token."""
        assert self.critic is not None
        values: list[torch.Tensor] = []
        micro = self.cfg.train.micro_batch_size
        self.critic.eval()
        with torch.no_grad():
            for start in range(0, len(rollouts), micro):
                b = collate(rollouts[start : start + micro], self.pad_id)
                values.extend(unpad(self.critic(b), b["mask"]))
        self.critic.train()
        width = max(v.numel() for v in values)
        n = len(rollouts)
        rew = torch.zeros(n, width)
        val = torch.zeros(n, width)
        msk = torch.zeros(n, width)
        for i, (r, v) in enumerate(zip(rollouts, values, strict=True)):
            c = v.numel()
            rew[i, c - 1] = r.reward  # outcome reward on the last completion token
            val[i, :c] = v
            msk[i, :c] = 1
        adv, ret = gae(rew, val, msk, self.cfg.critic.gamma, self.cfg.critic.lam)
        adv = whiten(adv, msk)
        return {
            "token_advantages": unpad(adv, msk),
            "returns": unpad(ret, msk),
            "old_values": values,
        }

    # -- the step ----------------------------------------------------------------------------
    def train_step(
        self,
        batch: list[Rollout],
        rng: np.random.Generator,
        *,
        step: int = 0,
        epochs: int | None = None,
        stale: Sequence[bool] | None = None,
        policy_frozen: bool = False,
    ) -> dict[str, float]:
        """`epochs` passes over the batch in shuffled mini-batches; returns averaged metrics.

        `stale[i]` marks rollouts of earlier policies (Mix-PPG clips them around
        pi_k / pi_beh); `policy_frozen` trains only the critic (critic warm-up).
        """
        cfg = self.cfg
        epochs = epochs or cfg.train.epochs
        stale_flags = list(stale) if stale is not None else [False] * len(batch)
        fields: dict[str, list[torch.Tensor]] = {}
        if cfg.algorithm.loss_type == "mix_ppg" and any(stale_flags):
            current = self._per_rollout(self.model, batch)
            # fresh data: c = pi_k / pi_beh = 1 exactly (plain PPO clipping)
            fields["anchor_logprobs"] = [
                cur if s else r.behaviour_logprobs
                for cur, s, r in zip(current, stale_flags, batch, strict=True)
            ]
        w_base, w_prev = self.kl_weights(step)
        if w_base > 0:
            if self.base_model is None:
                self.base_model = self._new_base()
            fields["base_logprobs"] = self._per_rollout(self.base_model, batch)
        if w_prev > 0:
            if self.prev_model is None:  # first use: pi_{k-1} unknown, start from pi_k
                self.prev_model = self._freeze_current()
            fields["prev_logprobs"] = self._per_rollout(self.prev_model, batch)
        if self.kl_weights(step + 1)[1] > 0:  # next step needs pi_{k-1} = this pi_k
            if self.prev_model is None:
                self.prev_model = self._freeze_current()
            else:
                self.prev_model.load_state_dict(self.model.state_dict())
        else:
            self.prev_model = None
        if w_base == 0 and self.kl_weights(step + 1)[0] == 0:
            self.base_model = None
        if cfg.algorithm.advantage == "gae":
            fields.update(self._gae_fields(batch))
        fields["stale"] = [
            torch.full((r.completion_ids.numel(),), float(s))
            for r, s in zip(batch, stale_flags, strict=True)
        ]
        mini = cfg.train.mini_batch_size or len(batch)
        sums: dict[str, list[float]] = defaultdict(list)
        self.model.train()
        for _ in range(epochs):
            order = rng.permutation(len(batch))
            for start in range(0, len(batch), mini):
                idx = order[start : start + mini]
                chunk = [batch[i] for i in idx]
                chunk_fields = {k: [v[i] for i in idx] for k, v in fields.items()}
                metrics = self._update(chunk, chunk_fields, w_base, w_prev, policy_frozen)
                for k, v in metrics.items():
                    sums[k].append(v)
        if not policy_frozen:
            self.version += 1
        out = {k: _nanmean(v) for k, v in sums.items()}
        out.update(kl_lambda=self.kl_lambda(step), kl_coef_base=w_base, kl_coef_prev=w_prev)
        return out

    def _update(
        self,
        minibatch: list[Rollout],
        fields: TokenFields,
        w_base: float,
        w_prev: float,
        policy_frozen: bool,
    ) -> dict[str, float]:
        """One optimizer step over a mini-batch, accumulated over micro-batches."""
        cfg, a = self.cfg, self.cfg.algorithm
        tokens = sum(r.completion_ids.numel() for r in minibatch)
        normaliser = float(tokens) if a.loss_agg == "token_mean" else float(len(minibatch))
        self.optimizer.zero_grad(set_to_none=True)
        if self.critic_optimizer is not None:
            self.critic_optimizer.zero_grad(set_to_none=True)
        sums: dict[str, float] = defaultdict(float)
        ratio_max = 0.0
        seq_log_ratios: list[torch.Tensor] = []
        ratios: list[torch.Tensor] = []
        centres: list[torch.Tensor] = []
        stale_tok: list[torch.Tensor] = []
        micro = cfg.train.micro_batch_size
        for start in range(0, len(minibatch), micro):
            part = minibatch[start : start + micro]
            part_fields = {k: v[start : start + micro] for k, v in fields.items()}
            b = collate(part, self.pad_id, part_fields)
            mask = b["mask"]
            part_tokens = float(mask.sum())
            if not policy_frozen:
                logps, entropy = token_logprobs(
                    self.model, b, cfg.rollout.temperature, entropy_grad=a.entropy_coef > 0
                )
                advantages = b["token_advantages"] if a.advantage == "gae" else b["advantages"]
                loss, metrics = self.loss_fn(
                    logps,
                    b["old_logprobs"],
                    advantages,
                    mask,
                    anchor_logprobs=b.get("anchor_logprobs"),
                    rewards=b["rewards"],
                    baselines=b["baselines"],
                    normaliser=normaliser,
                    epsilon=a.epsilon,
                    epsilon_high=a.epsilon_high,
                    loss_agg=a.loss_agg,
                    delta_v=a.asymre_delta_v,
                )
                total = loss
                sums["policy_loss"] += loss.item()
                if w_base > 0 or w_prev > 0:
                    kl_tok = kl_convex(
                        logps,
                        b.get("base_logprobs"),
                        b.get("prev_logprobs"),
                        w_base / (w_base + w_prev),
                        cfg.kl.estimator,
                    )
                    kl_loss = (w_base + w_prev) * aggregate(kl_tok, mask, a.loss_agg, normaliser)
                    total = total + kl_loss
                    sums["kl_loss"] += kl_loss.item()
                if a.entropy_coef > 0:
                    ent_term = aggregate(entropy, mask, a.loss_agg, normaliser)
                    total = total - a.entropy_coef * ent_term
                total.backward()
                sums["loss"] += total.item()
                with torch.no_grad():
                    log_ratio = (logps - b["old_logprobs"]) * mask
                    seq_log_ratios.append(log_ratio.sum(-1))
                    sums["entropy"] += float((entropy.detach() * mask).sum())
                    for name in ("base", "prev"):
                        ref = b.get(f"{name}_logprobs")
                        if ref is not None:
                            kl = torch.exp(ref - logps) - 1 - (ref - logps)  # k3 for logging
                            sums[f"kl_to_{name}"] += float((kl * mask).sum())
                    m = mask.bool()
                    ratios.append(torch.exp(logps.detach() - b["old_logprobs"])[m])
                    anchor = b.get("anchor_logprobs")
                    centres.append(
                        torch.exp(anchor - b["old_logprobs"])[m]
                        if anchor is not None
                        else torch.ones_like(ratios[-1])
                    )
                    stale_tok.append(b["stale"][m].bool())
                for k, v in metrics.items():  # token-weighted average over micro-batches
                    if k == "ratio_max":
                        ratio_max = max(ratio_max, v)
                    else:
                        sums[k] += v * part_tokens
            if self.critic is not None:
                values = self.critic(b)
                v_loss, v_metrics = clipped_value_loss(
                    values,
                    b["old_values"],
                    b["returns"],
                    mask,
                    cfg.critic.value_clip,
                    a.loss_agg,
                    normaliser,
                )
                v_loss.backward()
                sums["value_loss"] += v_loss.item()
                for k, v in v_metrics.items():
                    sums[k] += v * part_tokens
        out: dict[str, float] = {}
        if self.critic is not None:
            assert self.critic_optimizer is not None
            if self.grad_hook is not None:
                self.grad_hook(list(self.critic.parameters()))
            torch.nn.utils.clip_grad_norm_(
                self.critic.parameters(), cfg.train.max_grad_norm or math.inf
            )
            self.critic_optimizer.step()
            out["value_loss"] = sums.pop("value_loss")
            for k in ("value_clip_frac", "value_mse"):
                out[k] = sums.pop(k) / max(tokens, 1)
        if policy_frozen:
            return out
        max_norm = cfg.train.max_grad_norm
        if self.grad_hook is not None:  # every rank, same parameter order
            self.grad_hook([p for p in self.model.parameters() if p.requires_grad])
        params = [p for p in self.model.parameters() if p.grad is not None]
        grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm else math.inf)
        if not torch.isfinite(grad_norm):
            # a non-finite gradient would poison the weights: skip the step and say so
            self.optimizer.zero_grad(set_to_none=True)
            return {
                **out,
                "loss": sums["loss"],
                "grad_norm": float(grad_norm),
                "skipped_updates": 1.0,
            }
        self.optimizer.step()
        self.updates += 1
        for k in ("loss", "policy_loss", "kl_loss"):
            if k in sums:
                out[k] = sums.pop(k)
        out.update({k: v / max(tokens, 1) for k, v in sums.items()})
        eps_high = a.epsilon if a.epsilon_high is None else a.epsilon_high
        out.update(
            clip_stats(
                torch.cat(ratios), torch.cat(centres), torch.cat(stale_tok), a.epsilon, eps_high
            )
        )
        out.update(
            ratio_max=ratio_max,
            ess=importance_ess(torch.cat(seq_log_ratios)),
            grad_norm=float(grad_norm),
            lr=self.optimizer.param_groups[0]["lr"],
            skipped_updates=0.0,
        )
        return out

    def measure_backward(self, rollouts: list[Rollout]) -> None:
        """A forward+backward pass with no optimizer step (to time training per sample)."""
        micro = self.cfg.train.micro_batch_size
        for start in range(0, len(rollouts), micro):
            b = collate(rollouts[start : start + micro], self.pad_id)
            logps, _ = token_logprobs(self.model, b, self.cfg.rollout.temperature)
            (-(logps * b["mask"]).sum()).backward()
        self.optimizer.zero_grad(set_to_none=True)

    def state_dict(self) -> dict[str, object]:
        state: dict[str, object] = {
            "optimizer": self.optimizer.state_dict(),
            "version": self.version,
            "updates": self.updates,
            "base_model": self.base_model.state_dict() if self.base_model else None,
            "prev_model": self.prev_model.state_dict() if self.prev_model else None,
        }
        if self.critic is not None and self.critic_optimizer is not None:
            state["critic"] = self.critic.state_dict()
            state["critic_optimizer"] = self.critic_optimizer.state_dict()
        return state

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])  # type: ignore[arg-type]
        self.version = int(state["version"])  # type: ignore[arg-type]
        self.updates = int(state["updates"])  # type: ignore[arg-type]
        for name in ("base_model", "prev_model"):
            weights = state.get(name)
            current = getattr(self, name)
            if weights is None:
                setattr(self, name, None)
            elif weights == ADAPTERS_DISABLED:
                setattr(self, name, AdaptersDisabled(self.model))
            else:
                if self.lora:
                    frozen = current if isinstance(current, AdapterSnapshot) else None
                    frozen = frozen or AdapterSnapshot(self.model)
                else:
                    frozen = current or _frozen_copy(self.model)
                frozen.load_state_dict(weights)  # type: ignore[arg-type]
                setattr(self, name, frozen)
        if self.critic is not None and self.critic_optimizer is not None:
            self.critic.load_state_dict(state["critic"])  # type: ignore[arg-type]
            self.critic_optimizer.load_state_dict(state["critic_optimizer"])  # type: ignore[arg-type]
