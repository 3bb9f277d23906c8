"""The tiny demo model's SFT warm start: built once per (model, warm start, task) config and
cached, deterministic. It sits above `tasks` (its teacher) and `models` (the tiny model);
models.py imports nothing from here."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, cast

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from replayrl.config import ModelConfig, TaskConfig, WarmStartConfig
from replayrl.models import (
    atomic_save_pretrained,
    build_char_tokenizer,
    build_tiny_model,
    cache_dir,
)
from replayrl.tasks import task_from_config


class SFTTeacher(Protocol):
    """What a task needs for the warm start: a tokenizer corpus and (prompt, completion)
    pairs whose answers are wrong at `error_rate` (the mistaken teacher of phase 2)."""

    def corpus(self) -> list[str]: ...

    def sft_pairs(
        self, n: int, rng: np.random.Generator, error_rate: float, /
    ) -> list[tuple[str, str]]: ...


def _sft_phase(
    model: PreTrainedModel,
    tok: PreTrainedTokenizerBase,
    task: SFTTeacher,
    rng: np.random.Generator,
    steps: int,
    batch_size: int,
    lr: float,
    carry_error: float,
) -> float:
    """Teacher-forced SFT on (prompt, completion+EOS) pairs; loss on completion tokens only."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 50) * max(0.0, 1 - s / max(steps, 1))
    )
    model.train()
    loss_val = float("nan")
    for _ in range(steps):
        pairs = task.sft_pairs(batch_size, rng, carry_error)
        seqs, masks = [], []
        for prompt, completion in pairs:
            p = tok(prompt, add_special_tokens=False)["input_ids"]
            c = tok(completion, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            seqs.append(p + c)
            masks.append([0] * len(p) + [1] * len(c))
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), tok.pad_token_id, dtype=torch.long)
        attn = torch.zeros_like(ids)
        lmask = torch.zeros_like(ids, dtype=torch.float32)
        for i, (s, m) in enumerate(zip(seqs, masks, strict=True)):
            ids[i, : len(s)] = torch.tensor(s)
            attn[i, : len(s)] = 1
            lmask[i, : len(m)] = torch.tensor(m, dtype=torch.float32)
        logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1]
        targets, tmask = ids[:, 1:], lmask[:, 1:]
        nll = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.size(-1)), targets.reshape(-1), reduction="none"
        ).view_as(targets)
        loss = (nll * tmask).sum() / tmask.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        loss_val = loss.item()
    model.eval()
    return loss_val


def sft_warmstart(
    model: PreTrainedModel,
    tok: PreTrainedTokenizerBase,
    task: SFTTeacher,
    ws: WarmStartConfig,
) -> dict[str, float]:
    """Phase 1 on correct answers, then phase 2 on the task's mistaken teacher
    (`task.sft_pairs(n, rng, error_rate)` at `teacher_carry_error`); the final losses."""
    rng = np.random.default_rng(ws.seed)
    torch.manual_seed(ws.seed)
    out = {"sft_loss": _sft_phase(model, tok, task, rng, ws.steps, ws.batch_size, ws.lr, 0.0)}
    if ws.mistake_steps:
        out["sft_mistake_loss"] = _sft_phase(
            model,
            tok,
            task,
            rng,
            ws.mistake_steps,
            ws.batch_size,
            ws.mistake_lr,
            ws.teacher_carry_error,
        )
    return out


# the TaskConfig fields each built-in task's warm start depends on (arithmetic's set is the
# original one: existing configs keep their cached warm starts)
_WARMSTART_TASK_FIELDS = {
    "arithmetic": {"name", "digits", "eval_size", "seed"},
    "reasoning": {"name", "op", "digits", "min_digits", "terms", "eval_size", "seed"},
}
# arithmetic digits the built-in warm start gives a usable start policy for (measured: 3
# digits start at 0.0 eval accuracy with the default warm start, and nothing learns)
TINY_ARITHMETIC_DIGITS = (1, 2)


def _warmstart_task_fields(task_cfg: TaskConfig) -> set[str]:
    return _WARMSTART_TASK_FIELDS.get(task_cfg.name, set(TaskConfig.model_fields))


def check_tiny_task(task_cfg: TaskConfig) -> None:
    """Refuse tasks the built-in tiny model's warm start cannot start usefully (clear error)."""
    if task_cfg.name == "arithmetic" and task_cfg.digits not in TINY_ARITHMETIC_DIGITS:
        raise ValueError(
            f"task.digits={task_cfg.digits}: the built-in tiny model's warm start gives a usable "
            f"start policy for arithmetic with task.digits in {list(TINY_ARITHMETIC_DIGITS)} only "
            f"(at 3 digits it starts at 0.0 accuracy and no reward ever varies). For longer "
            f"sums use the written-out task (task.name=reasoning task.op=add "
            f"task.digits={task_cfg.digits}; see configs/reasoning-add.yaml), or set model.path "
            f"to a causal LM folder"
        )


def warmstart_key(cfg: ModelConfig, task_cfg: TaskConfig) -> str:
    payload = json.dumps(
        {
            "tiny": cfg.tiny.model_dump(),
            "warmstart": cfg.warmstart.model_dump(),
            # only what the task's warm start depends on: stable as TaskConfig grows
            "task": task_cfg.model_dump(include=_warmstart_task_fields(task_cfg)),
            "format": 2,
        },
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def ensure_warmstart(
    cfg: ModelConfig, task_cfg: TaskConfig, log: Callable[[str], object] = print
) -> Path:
    """Path of the tiny model's SFT warm start for this config, building it once if missing."""
    check_tiny_task(task_cfg)
    dest = cache_dir() / "warmstart" / warmstart_key(cfg, task_cfg)
    if (dest / "config.json").is_file():
        return dest
    task = task_from_config(task_cfg)
    # any task with a tokenizer corpus and an SFT teacher (arithmetic, reasoning) has one
    if not (callable(getattr(task, "corpus", None)) and callable(getattr(task, "sft_pairs", None))):
        raise ValueError(
            f"the built-in tiny model's warm start needs a task with corpus() and "
            f"sft_pairs(n, rng, error_rate) (task.name=arithmetic or reasoning), not "
            f"{task_cfg.name!r}: set model.path to a causal LM folder"
        )
    teacher = cast(SFTTeacher, task)  # checked just above
    tok = build_char_tokenizer(teacher.corpus())
    model = build_tiny_model(cfg, vocab_size=len(tok), seed=cfg.warmstart.seed)
    if cfg.warmstart.enabled and cfg.warmstart.steps:
        ws = cfg.warmstart
        log(f"building the tiny model's SFT warm start ({ws.steps}+{ws.mistake_steps} steps)")
        stats = sft_warmstart(model, tok, teacher, ws)
        log(f"warm start done ({', '.join(f'{k} {v:.3f}' for k, v in stats.items())}) -> {dest}")
    atomic_save_pretrained(model, tok, dest)
    return dest
