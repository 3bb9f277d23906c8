"""The learner: recomputes log-probs of stored rollouts and takes clipped policy-gradient steps."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence

import numpy as np
import torch
from transformers import PreTrainedModel

from replayrl.algorithms import get_policy_loss, importance_ess
from replayrl.config import Config
from replayrl.rollout import Rollout


def collate(rollouts: Sequence[Rollout], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded [prompt + completion] rows; `mask` marks completion tokens of `targets`."""
    lengths = [r.prompt_ids.numel() + r.completion_ids.numel() for r in rollouts]
    width = max(lengths)
    n = len(rollouts)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    attn = torch.zeros((n, width), dtype=torch.long)
    mask = torch.zeros((n, width - 1), dtype=torch.float32)
    old = torch.zeros((n, width - 1), dtype=torch.float32)
    for i, r in enumerate(rollouts):
        p, c = r.prompt_ids.numel(), r.completion_ids.numel()
        ids[i, :p] = r.prompt_ids
        ids[i, p : p + c] = r.completion_ids
        attn[i, : p + c] = 1
        # the token at position t is predicted by logits at t-1
        mask[i, p - 1 : p - 1 + c] = 1
        old[i, p - 1 : p - 1 + c] = r.behaviour_logprobs
    return {
        "input_ids": ids,
        "attention_mask": attn,
        "mask": mask,
        "old_logprobs": old,
        "advantages": torch.tensor([r.advantage for r in rollouts], dtype=torch.float32),
        "rewards": torch.tensor([r.reward for r in rollouts], dtype=torch.float32),
        "baselines": torch.tensor([r.group_mean_reward for r in rollouts], dtype=torch.float32),
    }


def token_logprobs(
    model: PreTrainedModel, batch: dict[str, torch.Tensor], temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log pi(token) under logits / temperature, and the per-token entropy (no grad)."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    logits = logits[:, :-1].float() / temperature
    logps = torch.log_softmax(logits, dim=-1)
    targets = batch["input_ids"][:, 1:]
    token_logps = logps.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    with torch.no_grad():
        entropy = -(logps.exp() * logps).sum(-1)
    return token_logps, entropy


class Learner:
    """Owns the policy's optimizer and version counter; one `train_step` per sampled batch."""

    def __init__(self, model: PreTrainedModel, pad_id: int, cfg: Config) -> None:
        self.model = model
        self.pad_id = pad_id
        self.cfg = cfg
        self.loss_fn = get_policy_loss(cfg.algorithm.loss_type)
        self.optimizer = torch.optim.AdamW(
            model.parameters(), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay
        )
        self.version = 0  # policy version: bumped after every training step
        self.updates = 0  # optimizer steps taken

    def _loss_kwargs(self) -> dict[str, object]:
        a = self.cfg.algorithm
        return {
            "epsilon": a.epsilon,
            "epsilon_high": a.epsilon_high,
            "loss_agg": a.loss_agg,
            "delta_v": a.asymre_delta_v,
        }

    def train_step(self, batch: list[Rollout], rng: np.random.Generator) -> dict[str, float]:
        """`epochs` passes over the batch in shuffled mini-batches; returns averaged metrics."""
        t = self.cfg.train
        mini = t.mini_batch_size or len(batch)
        sums: dict[str, list[float]] = defaultdict(list)
        self.model.train()
        for _ in range(t.epochs):
            order = rng.permutation(len(batch))
            for start in range(0, len(batch), mini):
                chunk = [batch[i] for i in order[start : start + mini]]
                for k, v in self._update(chunk).items():
                    sums[k].append(v)
        self.version += 1
        return {k: float(np.mean(v)) for k, v in sums.items()}

    def _update(self, minibatch: list[Rollout]) -> dict[str, float]:
        """One optimizer step over a mini-batch, accumulated over micro-batches."""
        cfg = self.cfg
        agg = cfg.algorithm.loss_agg
        tokens = sum(r.completion_ids.numel() for r in minibatch)
        normaliser = float(tokens) if agg == "token_mean" else float(len(minibatch))
        self.optimizer.zero_grad(set_to_none=True)
        metric_sums: dict[str, float] = defaultdict(float)
        entropy_sum, total_loss, ratio_max = 0.0, 0.0, 0.0
        seq_log_ratios = []
        micro = cfg.train.micro_batch_size
        for start in range(0, len(minibatch), micro):
            part = minibatch[start : start + micro]
            b = collate(part, self.pad_id)
            logps, entropy = token_logprobs(self.model, b, cfg.rollout.temperature)
            loss, metrics = self.loss_fn(
                logps,
                b["old_logprobs"],
                b["advantages"],
                b["mask"],
                rewards=b["rewards"],
                baselines=b["baselines"],
                normaliser=normaliser,
                **self._loss_kwargs(),
            )
            loss.backward()
            with torch.no_grad():
                seq_log_ratios.append(((logps - b["old_logprobs"]) * b["mask"]).sum(-1))
            total_loss += loss.item()
            part_tokens = float(b["mask"].sum())
            entropy_sum += float((entropy * b["mask"]).sum())
            for k, v in metrics.items():  # token-weighted average over micro-batches
                if k == "ratio_max":
                    ratio_max = max(ratio_max, v)
                else:
                    metric_sums[k] += v * part_tokens
        max_norm = cfg.train.max_grad_norm
        params = [p for p in self.model.parameters() if p.grad is not None]
        grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm else math.inf)
        if not torch.isfinite(grad_norm):
            # a non-finite gradient would poison the weights: skip the step and say so
            self.optimizer.zero_grad(set_to_none=True)
            return {"loss": total_loss, "grad_norm": float(grad_norm), "skipped_updates": 1.0}
        self.optimizer.step()
        self.updates += 1
        out = {k: v / max(tokens, 1) for k, v in metric_sums.items()}
        out.update(
            ratio_max=ratio_max,
            ess=importance_ess(torch.cat(seq_log_ratios)),
            loss=total_loss,
            grad_norm=float(grad_norm),
            entropy=entropy_sum / max(tokens, 1),
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
        return {
            "optimizer": self.optimizer.state_dict(),
            "version": self.version,
            "updates": self.updates,
        }

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])  # type: ignore[arg-type]
        self.version = int(state["version"])  # type: ignore[arg-type]
        self.updates = int(state["updates"])  # type: ignore[arg-type]
