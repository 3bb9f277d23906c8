"""A user's reward function in a worker process of its own (`rollout.reward_isolation`).

Why. A reward function is user code inside the training loop. Run in the trainer's process
it can end the run (`os._exit`, a segfault in native code), keep the process alive after
the run (a non-daemon thread), and a hang can only be abandoned, never stopped. In a worker
process each of these ends or stalls that worker only: the call fails with a reason
(`worker_died`: how it died, `timeout`: the worker is killed), its rollouts are dropped and
counted like any failing call, and a function failing on every call ends the run after
`train.failure_patience` steps (RewardFunctionFailed). The next call starts a new worker.

How. One worker per reward function, forked at its first call (the `fork` start method:
a callable passed through the Python API, a closure or a lambda, needs no pickling) and kept
for the next calls, so state the function keeps in globals lives on in the worker, not in
the trainer. Requests and replies are JSON behind an 8-byte length over two pipes: nothing
is unpickled, and the values come back as plain floats (or None, or the reason a value was
refused, judged by `values.check_value` in the worker). The worker ignores SIGINT, SIGTERM
and SIGHUP (the trainer handles them and stops its workers), and dies with the trainer
(PR_SET_PDEATHSIG on Linux; otherwise it ends when its request pipe closes).

Not specified by any paper: our choice. Costs: a fork per worker start, JSON both ways per
call (README "What happens when things fail" has the measured overhead); the function
cannot use a CUDA context the trainer created (use `reward_isolation: thread` for a reward
model on the GPU, or for a function that must change state in the trainer's process).
"""

from __future__ import annotations

import json
import os
import select
import signal
import struct
import sys
import time
import warnings
import weakref
from collections.abc import Callable
from typing import Any

from replayrl.rollout.rewards.values import RewardCallError, check_shape, check_value

_HEADER = struct.Struct("!Q")
MAX_MESSAGE = 1 << 30  # a reply larger than 1 GiB is not a list of floats
_CRASH_SIGNALS = {signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT, signal.SIGILL, signal.SIGFPE}
_live: weakref.WeakSet[RewardWorker] = weakref.WeakSet()


class _Timeout(Exception):
    pass


def _to_json(obj: Any) -> Any:
    """numpy scalars and arrays, tensors: their plain values (TRL passes dataset columns)."""
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, (set, frozenset)):
        return sorted(obj, key=repr)
    raise TypeError(f"{type(obj).__name__} is not JSON")


def _send(fd: int, obj: Any) -> None:
    _send_bytes(fd, json.dumps(obj, default=_to_json).encode())


def _send_bytes(fd: int, data: bytes) -> None:
    view = memoryview(_HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view) :]


def _read_exact(fd: int, n: int, deadline: float | None) -> bytes | None:
    """`n` bytes from `fd`; None at end of file (the other side is gone)."""
    chunks, got = [], 0
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise _Timeout
        chunk = os.read(fd, min(n - got, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _receive(fd: int, deadline: float | None = None) -> Any:
    """The next message, or None when the other side closed its end."""
    head = _read_exact(fd, _HEADER.size, deadline)
    if head is None:
        return None
    (size,) = _HEADER.unpack(head)
    if size > MAX_MESSAGE:
        raise ValueError(f"reward worker message of {size} bytes (limit {MAX_MESSAGE})")
    body = _read_exact(fd, size, deadline)
    return None if body is None else json.loads(body)


# -- the worker's side -----------------------------------------------------------------------


def _judge(out: Any, expected: int) -> dict[str, Any]:
    """A call's result as JSON: each value a float, None, or why it was refused."""
    values: list[Any] = []
    for v in check_shape(out, expected):
        try:
            values.append(check_value(v))
        except RewardCallError as err:
            values.append({"reason": err.reason, "message": str(err)})
    return {"values": values}


def _serve(fn: Callable[..., Any], requests: int, replies: int) -> None:
    """Answer calls until the trainer closes the request pipe."""
    while True:
        kwargs = _receive(requests)
        if kwargs is None:
            return
        try:
            reply = _judge(fn(**kwargs), len(kwargs.get("completions", [])))
        except RewardCallError as err:
            reply = {"reason": err.reason, "message": str(err)}
        except BaseException as exc:  # noqa: BLE001 - user code, SystemExit included
            reply = {"reason": "error", "message": f"{type(exc).__name__}: {exc}"}
        _send(replies, reply)


def _die_with_parent(parent: int) -> None:
    """SIGKILL when the trainer's process ends (Linux); a hung function must not outlive it."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # the trainer died before the line above
        os._exit(0)


def _child(fn: Callable[..., Any], requests: int, replies: int, parent: int) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # the trainer's to handle; it stops this worker
    _die_with_parent(parent)
    if "torch" in sys.modules:  # torch's thread pool does not survive a fork (DataLoader too)
        sys.modules["torch"].set_num_threads(1)
    _serve(fn, requests, replies)


# -- the trainer's side ----------------------------------------------------------------------


def _how(status: int) -> str:
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        sig = signal.Signals(-code)
        crash = " (a crash in native code)" if sig in _CRASH_SIGNALS else ""
        return f"was killed by {sig.name}{crash}"
    return f"exited with code {code} (os._exit, or an exit from native code)"


def _kill(pid: int, fds: tuple[int, ...]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


class RewardWorker:
    """A reward function in its own forked process; `call` is one TRL-style call."""

    def __init__(self, fn: Callable[..., Any], name: str) -> None:
        self.fn, self.name = fn, name
        self.pid: int | None = None
        self.requests = self.replies = -1
        self.starts = 0  # workers forked (the first, then one after each death or timeout)
        self._finalizer: weakref.finalize | None = None

    def start(self) -> None:
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        sys.stdout.flush()  # else the child's first flush repeats the trainer's pending output
        sys.stderr.flush()
        parent = os.getpid()
        with warnings.catch_warnings():  # "multi-threaded, fork() may deadlock": see _child
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # the worker: never returns into the trainer's code
            code = 0
            try:
                for w in list(_live):  # other workers' pipes: their EOF must not wait for us
                    for fd in (w.requests, w.replies):
                        if fd >= 0:
                            os.close(fd)
                os.close(req_w)
                os.close(rep_r)
                _child(self.fn, req_r, rep_w, parent)
            except BaseException:  # noqa: BLE001 - nothing to report to; the trainer sees EOF
                code = 1
            finally:
                os._exit(code)
        os.close(req_r)
        os.close(rep_w)
        self.pid, self.requests, self.replies = pid, req_w, rep_r
        self.starts += 1
        self._finalizer = weakref.finalize(self, _kill, pid, (req_w, rep_r))
        _live.add(self)

    def stop(self, grace_s: float = 0.0) -> str:
        """End the worker (if any; SIGKILL after `grace_s`) and say how it had ended."""
        if self.pid is None:
            return "was not running"
        pid, self.pid = self.pid, None
        for fd in (self.requests, self.replies):
            os.close(fd)
        self.requests = self.replies = -1
        if self._finalizer is not None:
            self._finalizer.detach()
        _live.discard(self)
        deadline = time.monotonic() + grace_s
        try:
            while True:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    return _how(status)
                if time.monotonic() >= deadline:
                    break
                time.sleep(0.002)
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except ChildProcessError:
            return "ended (its exit status is unknown)"
        return "was stopped"

    def call(self, kwargs: dict[str, Any], timeout: float | None) -> list[Any]:
        """The function's values for one call (floats, None, or RewardCallError for a
        refused value); raises RewardCallError for the call (error, wrong_length, timeout,
        worker_died, not_json)."""
        try:
            payload = json.dumps(kwargs, default=_to_json).encode()
        except (TypeError, ValueError) as exc:
            raise RewardCallError(
                "not_json",
                f"its inputs cannot be sent to its worker process as JSON ({exc}); set "
                "rollout.reward_isolation=thread to call it in the trainer's process",
            ) from None
        if self.pid is None:
            self.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            _send_bytes(self.requests, payload)
            reply = _receive(self.replies, deadline)
        except _Timeout:
            self.stop()
            raise RewardCallError(
                "timeout",
                f"did not return within {timeout:g} s (its worker process was stopped; a new "
                "one serves the next call)",
            ) from None
        except (BrokenPipeError, ConnectionResetError):
            reply = None
        except BaseException:  # a second Ctrl-C, a bad reply: the worker's state is unknown
            self.stop()
            raise
        if reply is None:
            how = self.stop(grace_s=5.0)  # its reply pipe closed: it is exiting, or gone
            raise RewardCallError("worker_died", f"its worker process {how} during the call")
        if "values" not in reply:
            raise RewardCallError(str(reply.get("reason")), str(reply.get("message")))
        return [
            RewardCallError(v["reason"], v["message"]) if isinstance(v, dict) else v
            for v in reply["values"]
        ]
