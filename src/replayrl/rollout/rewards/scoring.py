"""Score completions with several weighted reward functions, robust to faulty functions.

A reward function that raises, hangs, returns the wrong number of values, or returns a
value that is not a finite number must not crash or stall the run: the affected rollouts
are dropped and counted by reason, and the first error is kept for the log.

Timeouts. Python cannot kill a function running in a thread, so a per-call timeout here
is honest about what it does: each call runs in a fresh daemon thread; if it has not
returned within `timeout_s`, the call is abandoned (its result, if it ever comes, is
ignored), every rollout of that call is dropped with reason "timeout", and the thread is
left running in the background (it ends with the process). A call that timed out is never
retried item by item, and the item-by-item isolation of a call that raised shares one
`timeout_s` budget, so a slow function that raises costs at most about 2 x timeout_s per
step, not one timeout per item.

No silent non-training. Values, and each rollout's weighted sum, must be finite in float32
(the learner's dtype: 1e39 is finite in float64 but inf there). A function that fails on every
rollout of `patience` calls in a row (one call per step) ends the run with
`RewardFunctionFailed` naming it and its first error. Functions get copies of their inputs
(a function that empties `completions` cannot break scoring) and a `sys.exit` inside one is
that call's error, not the end of the run.

Isolation (`isolation="process"`, the CLI's default for user functions): each function that
is not built in runs in a worker process of its own (rewards/isolation.py), forked from a
server that `prepare_isolation` starts before the model loads, so `os._exit`, a
segfault or a hang ends or stalls that worker, never the run: the call fails with reason
`worker_died` (or `timeout`, and the worker is killed rather than abandoned), is not retried
item by item, and counts towards `patience` like any failing call. "thread": the behaviour
above, in this process.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from replayrl.errors import RewardFunctionFailed
from replayrl.rollout.rewards.isolation import ForkServer, RewardWorker
from replayrl.rollout.rewards.values import (
    FLOAT32_MAX,
    RewardCallError,
    check_shape,
    check_value,
)

RewardFunction = Callable[..., Sequence[float | None]]

DEFAULT_TIMEOUT_S = 60.0
Isolation = Literal["process", "thread"]
# reasons whose call is never retried item by item: each retry could cost as much again
_NOT_RETRIED = ("timeout", "worker_died")
_SHAPE = ("wrong_length", "not_a_list")  # reported as the batch call's, never a retried item's


@dataclass
class WeightedReward:
    name: str
    fn: RewardFunction
    weight: float = 1.0
    failed_steps: int = 0  # consecutive calls in which it failed on every rollout
    first_failure: str | None = None  # the first error of that streak
    builtin: bool = False  # replayrl's own (registered name): always called in-process
    worker: RewardWorker | None = field(default=None, repr=False, compare=False)

    def call_isolated(self, kwargs: dict[str, Any], timeout: float | None) -> list[Any]:
        """One call in this function's worker process (started at the first call)."""
        if self.worker is None:
            prepare_isolation([self])
        assert self.worker is not None
        return self.worker.call(kwargs, timeout)


def prepare_isolation(fns: Sequence[WeightedReward]) -> None:
    """Fork the server that the worker processes of `fns` (those not built in and without
    one) are forked from: call it before the model loads, so that neither the server nor the
    workers hold pages of the model or optimizer (rewards/isolation.py says why). `score`
    calls it for functions that have none (the server then forks from the trainer as it is).
    """
    if not hasattr(os, "fork"):
        raise ValueError(
            "rollout.reward_isolation=process needs os.fork (Linux, macOS); set it to thread"
        )
    todo = [wr for wr in fns if not wr.builtin and wr.worker is None]
    if todo:
        server = ForkServer([wr.fn for wr in todo])
        for i, wr in enumerate(todo):
            wr.worker = RewardWorker(wr.fn, wr.name, server, i)


@dataclass
class ScoreResult:
    rewards: list[float | None]  # None: dropped (a function failed, or none gave a value)
    per_function: dict[str, list[float | None]]
    errors: int = 0  # rollouts dropped because of a failing reward function (any reason)
    first_error: str | None = None
    error_counts: dict[str, int] = field(default_factory=dict)  # per function name
    reasons: dict[str, int] = field(default_factory=dict)  # dropped rollouts per reason
    seconds: float = 0.0  # wall time spent in reward functions (not generation)
    timeouts: int = 0  # calls abandoned after timeout_s
    # rollouts for which every function returned None ("not applicable"): no reward at all,
    # so they are skipped (rewards[i] is None), not trained as 0; not among `errors`
    no_reward: int = 0
    first_no_reward: str | None = None  # the prompt of the first such rollout (the warning's)

    def means(self) -> dict[str, float]:
        """Mean of each function's valid values (for per-function reward metrics)."""
        out = {}
        for name, vals in self.per_function.items():
            ok = [v for v in vals if v is not None]
            out[name] = sum(ok) / len(ok) if ok else float("nan")
        return out


def _columns(rows: Sequence[dict[str, Any]]) -> dict[str, list[Any]]:
    keys = [k for k in rows[0] if k != "prompt"] if rows else []
    return {k: [r.get(k) for r in rows] for k in keys}


def _run(fn: Callable[..., Any], kwargs: dict[str, Any], timeout: float | None, what: str) -> Any:
    if timeout is None:
        try:
            return fn(**kwargs)
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - user code: the call's failure
            raise RewardCallError("error", f"{type(exc).__name__}: {exc}") from exc
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["out"] = fn(**kwargs)
        except BaseException as exc:  # noqa: BLE001 - reported to the caller below
            box["exc"] = exc

    t = threading.Thread(target=target, name=f"reward:{what}", daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        raise RewardCallError(
            "timeout",
            f"did not return within {timeout:g} s (call abandoned; its thread keeps running "
            "in the background)",
        )
    if "exc" in box:
        exc = box["exc"]
        raise RewardCallError("error", f"{type(exc).__name__}: {exc}") from exc
    return box["out"]


def _call(
    wr: WeightedReward,
    prompts: list[str],
    completions: list[str],
    rows: Sequence[dict[str, Any]],
    timeout: float | None,
    isolated: bool,
) -> list[Any]:
    # copies: a function that edits its inputs (clears `completions`) must not change ours
    kwargs = {"prompts": list(prompts), "completions": list(completions), **_columns(rows)}
    if isolated:
        return check_shape(wr.call_isolated(kwargs, timeout), len(completions))
    return check_shape(_run(wr.fn, kwargs, timeout, wr.name), len(completions))


class _Scorer:
    def __init__(self, n: int, timeout: float | None, isolation: Isolation) -> None:
        self.timeout, self.isolation = timeout, isolation
        self.failed: list[str | None] = [None] * n  # the reason each rollout is dropped
        self.result = ScoreResult(rewards=[None] * n, per_function={})
        self.batch_error: RewardCallError | None = None  # the batch call's, while retrying
        self.function_errors: dict[str, str] = {}  # each function's first error

    def fail(self, wr: WeightedReward, i: int, err: RewardCallError) -> None:
        r = self.result
        if err.reason in _SHAPE and self.batch_error is not None:
            err = self.batch_error  # the real lengths (the batch's), not a retried item's
        self.function_errors.setdefault(wr.name, f"{err} [{err.reason}]")
        r.error_counts[wr.name] = r.error_counts.get(wr.name, 0) + 1
        if self.failed[i] is None:
            self.failed[i] = err.reason
        if r.first_error is None:
            r.first_error = f"reward function {wr.name!r}: {err} [{err.reason}]"

    def values(self, wr: WeightedReward, raw: list[Any], idx: list[int]) -> list[float | None]:
        out: list[float | None] = []
        for i, v in zip(idx, raw, strict=True):
            try:
                out.append(check_value(v))
            except RewardCallError as err:
                out.append(None)
                self.fail(wr, i, err)
        return out

    def run(self, wr: WeightedReward, prompts, completions, rows) -> list[float | None]:
        n = len(completions)
        self.batch_error = None
        isolated = self.isolation == "process" and not wr.builtin
        try:
            raw = _call(wr, prompts, completions, rows, self.timeout, isolated)
            return self.values(wr, raw, list(range(n)))
        except RewardCallError as err:
            if err.reason in _NOT_RETRIED:  # it could cost n more timeouts (or deaths)
                self.result.timeouts += err.reason == "timeout"
                for i in range(n):
                    self.fail(wr, i, err)
                return [None] * n
            self.batch_error = err if err.reason in _SHAPE else None
        # the batch call raised or returned a bad shape: isolate the failing items, within
        # one shared time budget
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        values: list[float | None] = []
        for i in range(n):
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                err = RewardCallError(
                    "timeout", f"item-by-item retries ran past {self.timeout:g} s"
                )
                self.fail(wr, i, err)
                values.append(None)
                continue
            try:
                one = (prompts[i : i + 1], completions[i : i + 1], rows[i : i + 1])
                raw = _call(wr, *one, left, isolated)
                values.extend(self.values(wr, raw, [i]))
            except RewardCallError as err:
                if err.reason in _NOT_RETRIED:
                    self.result.timeouts += err.reason == "timeout"
                    deadline = time.monotonic()  # stop retrying this function
                self.fail(wr, i, err)
                values.append(None)
        return values


def score(
    fns: Sequence[WeightedReward],
    prompts: list[str],
    completions: list[str],
    rows: Sequence[dict[str, Any]],
    timeout_s: float | None = DEFAULT_TIMEOUT_S,
    patience: int = 0,
    isolation: Isolation = "thread",
) -> ScoreResult:
    """Weighted sum of reward functions (None = not applicable, as in TRL's nansum); a
    rollout for which every function returned None has no reward (None, counted in
    `no_reward`).

    Each call gets `timeout_s` seconds (None: no timeout, called in this thread).
    `patience` > 0: a function failing on every rollout of that many calls in a row raises
    RewardFunctionFailed (its streak is kept on its WeightedReward).
    `isolation="process"`: each function that is not built in runs in its worker process.
    """
    if isolation not in ("process", "thread"):
        raise ValueError(f"reward isolation must be 'process' or 'thread', not {isolation!r}")
    if isolation == "process":
        prepare_isolation(fns)  # one server for the functions that have none yet
    t0 = time.perf_counter()
    n = len(completions)
    s = _Scorer(n, timeout_s, isolation)
    result = s.result
    for wr in fns:
        result.per_function[wr.name] = s.run(wr, prompts, completions, rows)
    for i in range(n):
        if s.failed[i] is None:
            vals = [(wr.weight, result.per_function[wr.name][i]) for wr in fns]
            if all(v is None for _, v in vals):
                # nothing said anything about it: a sum of nothing is no reward, not 0 (TRL
                # warns and trains 0; a reward of 0 would push the policy away from it)
                result.no_reward += 1
                if result.first_no_reward is None:
                    result.first_no_reward = str(prompts[i])
                continue
            total = sum(w * v for w, v in vals if v is not None)
            if math.isfinite(total) and abs(total) <= FLOAT32_MAX:
                result.rewards[i] = total
                continue
            s.failed[i] = "non_finite"  # each value fits, their weighted sum does not
            if result.first_error is None:
                result.first_error = (
                    f"weighted reward sum {total!r} is not finite in float32 (check the "
                    "reward weights) [non_finite]"
                )
        reason = s.failed[i]
        assert reason is not None
        result.reasons[reason] = result.reasons.get(reason, 0) + 1
    result.errors = sum(f is not None for f in s.failed)
    result.seconds = time.perf_counter() - t0
    if patience > 0 and n > 0:
        _track_failures(fns, result, s.function_errors, n, patience)
    return result


def _track_failures(
    fns: Sequence[WeightedReward],
    result: ScoreResult,
    errors: dict[str, str],
    n: int,
    patience: int,
) -> None:
    """Count each function's calls in a row that failed on every rollout; raise at `patience`."""
    for wr in fns:
        if result.error_counts.get(wr.name, 0) >= n:
            wr.failed_steps += 1
            if wr.first_failure is None:
                wr.first_failure = errors.get(wr.name, "unknown error")
            if wr.failed_steps >= patience:
                raise RewardFunctionFailed(wr.name, wr.first_failure, wr.failed_steps)
        else:
            wr.failed_steps, wr.first_failure = 0, None
