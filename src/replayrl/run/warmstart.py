"""SFT warm starts, built once per config and cached, deterministic: the tiny demo model's
(from scratch, on the task's teacher) and a pretrained model's short supervised warm-up on the
task's answers (`model.sft`). It sits above `tasks` (the teachers) and `models`; models/loading.py
imports nothing from here."""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol, cast

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from replayrl.config.registries import TASKS
from replayrl.config.schema import LoraConfig, ModelConfig, TaskConfig, WarmStartConfig
from replayrl.models.loading import (
    apply_lora,
    atomic_folder,
    atomic_save_pretrained,
    build_char_tokenizer,
    build_tiny_model,
    cache_dir,
    is_adapter_folder,
    load_pretrained,
)
from replayrl.rollout.prompts import PromptRenderer
from replayrl.rollout.tasks import task_from_config
from replayrl.rollout.tasks.base import Row
from replayrl.run.records.provenance import weights_sha256
from replayrl.storage.io import atomic_write_json

_CPU = torch.device("cpu")
# progress lines per warm-up phase: a first run spends minutes here, so it says how far it is
# and how long is left (plain lines: they read the same in a terminal, a log file or CI)
PROGRESS_LINES = 20


def _clock(seconds: float) -> str:
    """m:ss (or h:mm:ss) for a progress line."""
    m, s = divmod(int(seconds + 0.5), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def _progress_line(label: str, done: int, total: int, loss: float, started: float) -> str:
    """'label: step 30/600 (5%), loss 1.234, 0:40 elapsed, ~12:40 left'."""
    elapsed = time.monotonic() - started
    left = elapsed / done * (total - done)
    return (
        f"  {label}: step {done}/{total} ({100 * done // total}%), loss {loss:.3f}, "
        f"{_clock(elapsed)} elapsed, ~{_clock(left)} left"
    )


try:
    import fcntl
except ImportError:  # not POSIX: no lock (parallel first runs may each build, atomically)
    fcntl = None  # type: ignore[assignment]


@contextlib.contextmanager
def build_lock(dest: Path) -> Iterator[None]:
    """Hold an exclusive lock for building `dest`, so that processes starting together (a
    suite's parallel runs, async workers) build a cached warm start once: the others wait,
    then find it built."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    if fcntl is None:
        yield
        return
    with open(dest.parent / f".{dest.name}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


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
    warmup_steps: int = 50,
    autocast: torch.dtype | None = None,
    log: Callable[[str], object] | None = None,
    device: torch.device = _CPU,
    label: str = "warm-up",
) -> float:
    """Teacher-forced SFT on (prompt, completion+EOS) pairs; loss on completion tokens only.
    The learning rate warms up linearly over `warmup_steps`, then decays linearly to 0;
    `autocast` runs forward and backward in that dtype (fp32 master weights), on `device`
    (the run's train.device: a warm-up on the CPU of a GPU machine is many times slower).
    `log` gets a progress line (`label`, step, loss, time left) PROGRESS_LINES times."""
    model.to(device)  # type: ignore[arg-type]  # transformers types its `to` for dtypes only
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup_steps) * max(0.0, 1 - s / max(steps, 1))
    )
    model.train()
    loss_val = float("nan")
    started, every = time.monotonic(), max(1, steps // PROGRESS_LINES)
    for step in range(steps):
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
        ids, attn, lmask = ids.to(device), attn.to(device), lmask.to(device)
        with torch.autocast(
            device.type, dtype=autocast or torch.bfloat16, enabled=autocast is not None
        ):
            logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1]
        targets, tmask = ids[:, 1:], lmask[:, 1:]
        nll = torch.nn.functional.cross_entropy(
            logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1), reduction="none"
        ).view_as(targets)
        loss = (nll * tmask).sum() / tmask.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        loss_val = loss.item()
        if log is not None and ((step + 1) % every == 0 or step + 1 == steps):
            log(_progress_line(label, step + 1, steps, loss_val, started))
    model.eval()
    return loss_val


def sft_warmstart(
    model: PreTrainedModel,
    tok: PreTrainedTokenizerBase,
    task: SFTTeacher,
    ws: WarmStartConfig,
    device: torch.device = _CPU,
    log: Callable[[str], object] | None = None,
) -> dict[str, float]:
    """Phase 1 on correct answers, then phase 2 on the task's mistaken teacher
    (`task.sft_pairs(n, rng, error_rate)` at `teacher_carry_error`); the final losses.
    `log` gets each phase's progress lines."""
    rng = np.random.default_rng(ws.seed)
    torch.manual_seed(ws.seed)
    phases = 2 if ws.mistake_steps else 1
    out = {
        "sft_loss": _sft_phase(
            model,
            tok,
            task,
            rng,
            ws.steps,
            ws.batch_size,
            ws.lr,
            0.0,
            log=log,
            device=device,
            label=f"warm start phase 1/{phases} (correct answers)",
        )
    }
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
            log=log,
            device=device,
            label="warm start phase 2/2 (mistaken teacher)",
        )
    return out


def _warmstart_task(task_cfg: TaskConfig) -> dict[str, Any]:
    """The task settings the warm start depends on, by name (its registry entry's; all when
    it names none), common and task-own alike: a flat dict, as the task section was before
    each task had its own, so existing warm starts keep their keys."""
    fields = TASKS.get(task_cfg.name).warmstart_fields
    flat = task_cfg.flat()
    return flat if fields is None else {k: v for k, v in flat.items() if k in fields}


def check_tiny_task(task_cfg: TaskConfig) -> None:
    """Refuse tasks the built-in tiny model's warm start cannot start usefully (clear error)."""
    check = TASKS.get(task_cfg.name).tiny_check
    if check is not None:
        check(task_cfg)


def warmstart_key(cfg: ModelConfig, task_cfg: TaskConfig) -> str:
    payload = json.dumps(
        {
            "tiny": cfg.tiny.model_dump(),
            "warmstart": cfg.warmstart.model_dump(),
            # only what the task's warm start depends on: stable as TaskConfig grows
            "task": _warmstart_task(task_cfg),
            "format": 2,
        },
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def ensure_warmstart(
    cfg: ModelConfig,
    task_cfg: TaskConfig,
    log: Callable[[str], object] = print,
    device: torch.device = _CPU,
) -> Path:
    """Path of the tiny model's SFT warm start for this config, building it once if missing."""
    check_tiny_task(task_cfg)
    dest = cache_dir() / "warmstart" / warmstart_key(cfg, task_cfg)
    if (dest / "config.json").is_file():
        return dest
    with build_lock(dest):
        if not (dest / "config.json").is_file():  # another process may have built it
            _build_tiny_warmstart(cfg, task_cfg, dest, log, device)
    return dest


def _build_tiny_warmstart(
    cfg: ModelConfig,
    task_cfg: TaskConfig,
    dest: Path,
    log: Callable[[str], object],
    device: torch.device = _CPU,
) -> None:
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
        log(
            f"building the tiny model's SFT warm start ({ws.steps}+{ws.mistake_steps} steps; "
            f"once, then cached in {dest.parent})"
        )
        stats = sft_warmstart(model, tok, teacher, ws, device, log=log)
        log(f"warm start done ({', '.join(f'{k} {v:.3f}' for k, v in stats.items())}) -> {dest}")
    atomic_save_pretrained(model, tok, dest)


class AnswerTeacher(Protocol):
    """What a task needs for a pretrained model's warm-up (`model.sft`): training rows and the
    teacher's reply to one (wrong at `error_rate`)."""

    def sample_train(self, n: int, rng: np.random.Generator, /) -> list[Row]: ...

    def sft_completion(self, row: Row, rng: np.random.Generator, error_rate: float, /) -> str: ...


class RenderedPairs:
    """(prompt, completion) pairs from a task's training rows, each prompt rendered exactly as
    the run will render it (chat template, system prompt), so the warm-up teaches the format
    the policy is then sampled in."""

    def __init__(self, task: AnswerTeacher, render: Callable[[Any], str]) -> None:
        self.task = task
        self.render = render

    def corpus(self) -> list[str]:
        return []

    def sft_pairs(
        self, n: int, rng: np.random.Generator, error_rate: float
    ) -> list[tuple[str, str]]:
        rows = self.task.sample_train(n, rng)
        return [
            (self.render(r["prompt"]), self.task.sft_completion(r, rng, error_rate)) for r in rows
        ]


def _source_fingerprint(path: str) -> dict[str, object]:
    """What identifies the pretrained model: its path, config and weight files' sizes/mtimes
    (a hub id: the id only)."""
    folder = Path(path)
    if not folder.is_dir():
        return {"path": path}
    files = sorted(
        (f.name, f.stat().st_size, int(f.stat().st_mtime))
        for f in folder.iterdir()
        if f.is_file() and f.suffix in {".json", ".safetensors", ".bin"}
    )
    return {"path": str(folder.resolve()), "files": files}


def sft_warmup_key(path: str, cfg: ModelConfig, task_cfg: TaskConfig) -> str:
    payload = json.dumps(
        {
            "source": _source_fingerprint(path),
            "sft": cfg.sft.model_dump(),
            "task": task_cfg.model_dump(),  # rows, rendering and split all matter
            "format": 1,
        },
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def ensure_sft_warmup(
    path: str,
    cfg: ModelConfig,
    task_cfg: TaskConfig,
    log: Callable[[str], object] = print,
    device: torch.device = _CPU,
) -> Path:
    """The folder of `path` after `model.sft.steps` of supervised warm-up on the task's
    answers (LoRA merged into the weights, or full fine-tuning; fp32 master weights, saved in
    fp32), building it once if missing."""
    if is_adapter_folder(path):
        raise ValueError(
            f"model.sft: {path} is a LoRA adapter folder; the supervised warm-up fine-tunes a "
            f"full model: set model.path to the base model"
        )
    dest = cache_dir() / "sft" / sft_warmup_key(path, cfg, task_cfg)
    if (dest / "config.json").is_file():
        return dest
    with build_lock(dest):
        if not (dest / "config.json").is_file():  # another process may have built it
            _build_sft_warmup(path, cfg, task_cfg, dest, log, device)
    return dest


def _build_sft_warmup(
    path: str,
    cfg: ModelConfig,
    task_cfg: TaskConfig,
    dest: Path,
    log: Callable[[str], object],
    device: torch.device = _CPU,
) -> None:
    task = task_from_config(task_cfg)
    if not callable(getattr(task, "sft_completion", None)):
        raise ValueError(
            f"model.sft: task {task_cfg.name!r} has no teacher replies for a supervised "
            f"warm-up (task.name=reasoning_gym has); set model.sft.steps=0"
        )
    sft = cfg.sft
    log(f"building the supervised warm-up of {path} ({sft.steps} steps of {sft.batch_size})")
    torch.manual_seed(sft.seed)
    model, tok = load_pretrained(path, "float32")
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    trained: torch.nn.Module = model
    if sft.lora_r:
        lora = LoraConfig(
            enabled=True, r=sft.lora_r, alpha=2 * sft.lora_r, target_modules=["all-linear"]
        )
        trained = apply_lora(model, cfg.model_copy(update={"lora": lora}), seed=sft.seed)
    render = PromptRenderer(tok, task_cfg.chat_template, task_cfg.system_prompt)
    teacher = RenderedPairs(cast(AnswerTeacher, task), render)
    loss = _sft_phase(
        cast(PreTrainedModel, trained),
        tok,
        teacher,
        np.random.default_rng(sft.seed),
        sft.steps,
        sft.batch_size,
        sft.lr,
        sft.teacher_error,
        warmup_steps=max(1, sft.steps // 10),
        autocast=torch.bfloat16 if sft.autocast == "bfloat16" else None,
        log=log,
        device=device,
        label="supervised warm-up",
    )
    if sft.lora_r:
        model = cast(Any, trained).merge_and_unload()  # a plain model folder again
    log(f"supervised warm-up done (last loss {loss:.3f}) -> {dest}")
    atomic_save_pretrained(model, tok, dest)


PIN_MANIFEST = "warmstart.json"  # beside the pinned weights: key, hash, what it was built for


def _copy_folder(src: Path, dest: Path, skip: tuple[str, ...] = ()) -> None:
    """Copy the files of `src` into `dest`, replacing it atomically."""

    def fill(tmp: Path) -> None:
        for f in src.iterdir():
            if f.is_file() and f.name not in skip and not f.name.startswith("."):
                shutil.copy2(f, tmp / f.name)

    atomic_folder(dest, fill)


def pinned_warmstart(
    cfg: ModelConfig,
    task_cfg: TaskConfig,
    folder: Path | None,
    export: bool = False,
    log: Callable[[str], object] = print,
) -> dict[str, Any]:
    """The tiny model's warm start for this config, pinned: when `folder` holds one (its
    manifest `warmstart.json` names the cache key and the weights' SHA-256), it is checked and
    installed as the cached warm start, so every run of this config starts from exactly these
    weights on any machine; else it is built (or found) in the cache, and with `export` copied
    into `folder` with its manifest, to be committed. Only safetensors and JSON are read.
    Returns {key, sha256, source}; ValueError on a manifest for another config or weights
    that do not match their manifest."""
    key = warmstart_key(cfg, task_cfg)
    cached = cache_dir() / "warmstart" / key
    if folder is not None and (folder / PIN_MANIFEST).is_file():
        manifest = folder / PIN_MANIFEST
        pinned = json.loads(manifest.read_text())
        if pinned.get("key") != key:
            raise ValueError(
                f"{folder}: the pinned warm start was built for another config (key "
                f"{pinned.get('key')}, this run's {key}): remove it to pin a new one"
            )
        sha = weights_sha256(folder)
        if sha is None or sha != pinned.get("sha256"):
            raise ValueError(f"{folder}: weights do not match the SHA-256 in {PIN_MANIFEST}")
        if any(f.suffix in {".bin", ".pt", ".pth", ".pkl"} for f in folder.iterdir()):
            raise ValueError(f"{folder}: a pinned warm start holds safetensors, never pickles")
        with build_lock(cached):
            if weights_sha256(cached) != sha:
                log(f"warm start {key}: installing the pinned weights from {folder}")
                _copy_folder(folder, cached, skip=(PIN_MANIFEST,))
        return {"key": key, "sha256": sha, "source": str(folder)}
    path = ensure_warmstart(cfg, task_cfg, log)
    sha = weights_sha256(path)
    if sha is None:
        raise ValueError(f"{path}: the warm start has no safetensors weights to pin")
    if export and folder is not None:
        _copy_folder(path, folder)
        described = {
            "key": key,
            "sha256": sha,
            "tiny": cfg.tiny.model_dump(),
            "warmstart": cfg.warmstart.model_dump(),
            "task": _warmstart_task(task_cfg),
        }
        atomic_write_json(folder / PIN_MANIFEST, described)
        log(f"warm start {key} pinned in {folder} (sha256 {sha[:12]})")
        return {"key": key, "sha256": sha, "source": str(folder)}
    return {"key": key, "sha256": sha, "source": "built"}
