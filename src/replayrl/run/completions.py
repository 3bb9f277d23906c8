"""The completions log: what the model wrote, what it was paid, and what was done with it.

At step 1 and every `logging.completions_every` steps, `logging.completions` rollouts of the
step (fresh ones spread over prompts, plus the replayed ones the batch trained on) are
appended to `completions.jsonl` in the run folder, one JSON object per line, flushed at once;
TensorBoard gets them as a text table, W&B as a Table, and with the progress bar on a short
table is printed. Each record:

    step, prompt, completion, reward (combined), rewards ({function: value}), advantage,
    correct, trained (in this step's batch), origin ("fresh" or "replayed"), age (policy
    versions between the weights that generated it and the ones it trained), policy_version,
    completion_tokens, truncated, group

`completions_records` is the pure part (which rollouts, as what records); `CompletionsLog`
writes them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from replayrl.data.rollout_record import Rollout
from replayrl.storage.io import atomic_write_text

FILE = "completions.jsonl"
TABLE_COLUMNS = ["step", "origin", "trained", "reward", "advantage", "prompt", "completion"]
_PRINT_CHARS = 60  # per text cell of the printed table


def _pick_spread(rollouts: list[Rollout], n: int) -> list[Rollout]:
    """Up to n rollouts taking one per prompt group in turn, so a few prompts are each seen
    with more than one completion only once every prompt has one."""
    by_group: dict[int, list[Rollout]] = {}
    for r in rollouts:
        by_group.setdefault(r.group_id, []).append(r)
    out: list[Rollout] = []
    rank = 0
    while len(out) < n and any(rank < len(g) for g in by_group.values()):
        for g in by_group.values():
            if rank < len(g) and len(out) < n:
                out.append(g[rank])
        rank += 1
    return out


def completions_records(
    step: int, fresh: list[Rollout], batch: list[Rollout], version: int, n: int
) -> list[dict[str, Any]]:
    """The log records of one step: up to n rollouts, at most half of them replayed ones
    from the batch (when there are any), the rest fresh ones spread over prompts.

    `fresh`: the rollouts generated for this step; `batch`: those trained on; `version`: the
    policy version the batch was trained at (age = version - the rollout's policy_version).
    """
    if n <= 0:
        return []
    fresh_ids = {id(r) for r in fresh}
    replayed = [r for r in batch if id(r) not in fresh_ids]
    n_replayed = min(len(replayed), n // 2) if fresh else min(len(replayed), n)
    chosen = _pick_spread(fresh, n - n_replayed) + _pick_spread(replayed, n_replayed)
    trained = {id(r) for r in batch}
    return [_record(step, r, id(r) in trained, id(r) in fresh_ids, version) for r in chosen]


def _record(step: int, r: Rollout, trained: bool, fresh: bool, version: int) -> dict[str, Any]:
    return {
        "step": step,
        "prompt": r.prompt_text,
        "completion": r.completion_text,
        "reward": r.reward,
        "rewards": dict(r.extras.get("rewards", {})),
        "advantage": r.advantage,
        "correct": bool(r.correct),
        "trained": trained,
        "origin": "fresh" if fresh else "replayed",
        "age": version - r.policy_version,
        "policy_version": r.policy_version,
        "completion_tokens": r.num_completion_tokens,
        "truncated": bool(r.truncated),
        "group": r.group_id,
    }


def short_text(text: str, chars: int = _PRINT_CHARS) -> str:
    """One line of at most `chars` characters (newlines shown as ⏎, the end cut with …); an
    empty text (the model stopped at once) says so."""
    if not text:
        return "(empty)"
    flat = text.replace("\n", "⏎")
    return flat if len(flat) <= chars else flat[: chars - 1] + "…"


def format_table(records: Iterable[dict[str, Any]], chars: int = _PRINT_CHARS) -> str:
    """The short printed table: one line per completion, prompt and completion cut short
    (`completions.jsonl` has them whole)."""
    lines = [f"{'origin':<8} {'trained':<7} {'reward':>7} {'adv':>6}  prompt -> completion"]
    for r in records:
        reward = f"{r['reward']:.3g}" if r.get("reward") is not None else "-"
        adv = f"{r['advantage']:.2f}" if r.get("advantage") is not None else "-"
        trained = "yes" if r.get("trained") else "no"
        prompt = short_text(str(r["prompt"]), chars // 2)
        completion = short_text(str(r["completion"]), chars)
        lines.append(
            f"{r.get('origin', '-'):<8} {trained:<7} {reward:>7} {adv:>6}  {prompt} -> {completion}"
        )
    return "\n".join(lines)


def table_rows(records: list[dict[str, Any]]) -> list[list[Any]]:
    """Rows of `TABLE_COLUMNS` for TensorBoard / W&B."""
    return [[r.get(c) for c in TABLE_COLUMNS] for r in records]


def read_completions(path: Path) -> list[dict[str, Any]]:
    """The records of a completions.jsonl (a last line cut short by a crash is skipped)."""
    out = []
    lines = path.read_text(errors="replace").splitlines()
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines):
                continue  # an interrupted append
            raise ValueError(f"{path}:{i}: not a JSON record") from None
    return out


class CompletionsLog:
    """Writes the completions of logged steps (see the module docstring)."""

    def __init__(
        self,
        run_dir: Path,
        n: int,
        every: int,
        table: Callable[[str, list[str], list[list[Any]], int], None] | None = None,
        printer: Callable[[str], None] | None = None,
        resume_step: int | None = None,
    ) -> None:
        """`table`: the metrics logger's `table` (TensorBoard / W&B); `printer`: where the
        short table goes (None: not printed); `resume_step`: records after it (written before
        a crash, about to be written again) are dropped first."""
        self.n, self.every = n, max(1, every)
        self.path = run_dir / FILE
        self._table, self._printer = table, printer
        if resume_step is not None and self.path.exists():
            kept = [r for r in read_completions(self.path) if r.get("step", 0) <= resume_step]
            atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in kept))
        elif resume_step is None and n > 0 and self.path.exists():
            self.path.unlink()  # a fresh run in a reused folder starts a fresh log

    def due(self, step: int) -> bool:
        return self.n > 0 and (step == 1 or step % self.every == 0)

    def log(self, step: int, fresh: list[Rollout], batch: list[Rollout], version: int) -> int:
        """Write this step's records if it is a logged step; returns how many were written."""
        if not self.due(step):
            return 0
        records = completions_records(step, fresh, batch, version, self.n)
        if not records:
            return 0
        with self.path.open("a") as f:
            f.write("".join(json.dumps(r) + "\n" for r in records))
            f.flush()
        if self._table is not None:
            self._table("completions", TABLE_COLUMNS, table_rows(records), step)
        if self._printer is not None:
            self._printer(f"completions at step {step}:\n{format_table(records)}")
        return len(records)
