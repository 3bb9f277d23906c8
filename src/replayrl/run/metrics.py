"""Metric sinks: JSONL always, TensorBoard and Weights & Biases when enabled, a progress bar.

All three sinks get the same names (`reward/mean`, `train/loss`, `eval/accuracy`, ...) at the
same step; TensorBoard and W&B take the finite numbers of each record (JSONL keeps every
value, NaN as null).
"""

from __future__ import annotations

import json
import math
import secrets
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from replayrl.storage.io import atomic_write_text

if TYPE_CHECKING:
    from replayrl.config.schema import Config

WANDB_ID_FILE = "wandb_id"  # the W&B run id, so a resumed run logs into the same W&B run


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None  # JSON has no NaN; None reads as "not measured"
    return v


class MetricsLogger:
    """Appends one JSON record per step. On resume from step k, records after k (logged
    before a crash, and about to be logged again) are dropped first, so each step appears once.
    """

    def __init__(
        self,
        run_dir: Path,
        tensorboard: bool = True,
        resume_step: int | None = None,
        log: Callable[[str], None] = print,
        wandb: dict[str, Any] | None = None,
    ):
        """`wandb`: keyword arguments of `wandb.init` (project, entity, name, config), or None
        for no W&B logging."""
        self.path = run_dir / "metrics.jsonl"
        if resume_step is not None and self.path.exists():
            records = read_metrics(self.path, log=log)
            kept = [r for r in records if r.get("step", 0) <= resume_step]
            atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in kept))
        self._file = self.path.open("a" if resume_step is not None else "w")
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            purge = resume_step + 1 if resume_step is not None else None
            self._tb = SummaryWriter(log_dir=str(run_dir / "tensorboard"), purge_step=purge)
        self._wandb = _start_wandb(run_dir, wandb) if wandb is not None else None

    @classmethod
    def from_config(
        cls,
        run_dir: Path,
        cfg: Config,
        resume_step: int | None = None,
        log: Callable[[str], None] = print,
    ) -> MetricsLogger:
        """The sinks `cfg.logging` asks for; W&B gets the whole resolved config."""
        lg = cfg.logging
        wandb = None
        if lg.wandb:
            wandb = {
                "project": lg.wandb_project,
                "entity": lg.wandb_entity,
                "name": lg.name,
                "config": cfg.model_dump(mode="json"),
            }
        return cls(run_dir, lg.tensorboard, resume_step=resume_step, log=log, wandb=wandb)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        record = {"step": step, **{k: _clean(v) for k, v in metrics.items()}}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        scalars = numeric(metrics)
        if self._tb is not None:
            for k, v in scalars.items():
                self._tb.add_scalar(k, v, step)
        if self._wandb is not None and scalars:
            self._wandb.log(scalars, step=step)

    def table(self, key: str, columns: list[str], rows: list[list[Any]], step: int) -> None:
        """A table of text rows (the completions log): TensorBoard text (Markdown), W&B Table."""
        if not rows:
            return
        if self._tb is not None:
            self._tb.add_text(key, markdown_table(columns, rows), step)
        if self._wandb is not None:
            import wandb

            self._wandb.log({key: wandb.Table(columns=columns, data=rows)}, step=step)

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


def numeric(metrics: dict[str, Any]) -> dict[str, float]:
    """The finite numbers of a record: what TensorBoard and W&B receive."""
    return {
        k: float(v)
        for k, v in metrics.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    }


def markdown_table(columns: list[str], rows: list[list[Any]]) -> str:
    """A Markdown table (TensorBoard renders it); `|` and newlines in cells are escaped."""

    def cell(v: Any) -> str:
        text = f"{v:.3g}" if isinstance(v, float) else str(v)
        return text.replace("|", "\\|").replace("\n", "<br>")

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)


def _start_wandb(run_dir: Path, kwargs: dict[str, Any]) -> Any:
    """A W&B run writing under `run_dir`, resumed when the run folder already has one."""
    try:
        import wandb
    except ImportError as exc:
        raise ImportError(
            "logging.wandb=true needs the wandb package: pip install 'replayrl[wandb]'"
        ) from exc
    id_file = run_dir / WANDB_ID_FILE
    run_id = id_file.read_text().strip() if id_file.is_file() else None
    if run_id is None:
        run_id = secrets.token_hex(4)  # 8 characters, as W&B's own ids
        atomic_write_text(id_file, run_id)
    return wandb.init(
        dir=str(run_dir),
        id=run_id,
        resume="allow",
        reinit="finish_previous",
        **{k: v for k, v in kwargs.items() if v is not None},
    )


def read_metrics(path: Path, log: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Records of a metrics.jsonl. A last line cut short (the process died mid-write) is
    dropped with a warning (`log`, else `warnings`); a bad line elsewhere is an error
    naming file and line."""
    lines = path.read_text(errors="replace").split("\n")
    out = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError as exc:
            if i == len(lines):  # no newline after it: an interrupted append
                msg = f"warning: {path}:{i}: dropped a partial last line ({len(line)} chars)"
                if log is not None:
                    log(msg)
                else:
                    warnings.warn(msg, stacklevel=2)
                continue
            raise ValueError(f"{path}:{i}: not a JSON record ({exc.msg})") from None
    return out


class Progress:
    """A tqdm bar over training steps with the key numbers in its postfix."""

    def __init__(self, total: int, initial: int, enabled: bool) -> None:
        self._bar = None
        if enabled:
            from tqdm import tqdm

            self._bar = tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True)

    def update(self, **numbers: float) -> None:
        if self._bar is not None:
            self._bar.set_postfix({k: f"{v:.3g}" for k, v in numbers.items()}, refresh=False)
            self._bar.update(1)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
