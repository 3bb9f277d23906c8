"""A user's reward function in a worker process of its own (`rollout.reward_isolation`).

Why. A reward function is user code inside the training loop. Run in the trainer's process
it can end the run (`os._exit`, a segfault in native code), keep the process alive after
the run (a non-daemon thread), and a hang can only be abandoned, never stopped. In a worker
process each of these ends or stalls that worker only: the call fails with a reason
(`worker_died`: how it died, `timeout`: the worker is killed), its rollouts are dropped and
counted like any failing call, and a function failing on every call ends the run after
`train.failure_patience` steps (RewardFunctionFailed). The next call starts a new worker.

How. A small fork server (`ForkServer`) is forked from the trainer when the reward set is
built, before the model loads (run/components.py, run/distributed/worker.py); each function's
worker is forked from that server at the function's first call (the `fork` start method: a
callable passed through the Python API, a closure or a lambda, needs no pickling) and kept
for the next calls, so state the function keeps in globals lives on in the worker, not in
the trainer. Why a server: a worker forked from the trainer after the model and optimizer
load shares their pages copy-on-write, and every page the trainer then writes leaves the
old copy to the worker (each worker would grow to the size of the trainer's memory). The
server and its workers never had those pages. The trainer creates each worker's two pipes
and passes their far ends to the server over a Unix socket (SCM_RIGHTS); the server forks,
reaps, and reports how a worker ended (`_how`). Requests and replies are JSON behind an
8-byte length: nothing is unpickled, and the values come back as plain floats (or None, or
the reason a value was refused, judged by `values.check_value` in the worker). The server
and workers ignore SIGINT, SIGTERM and SIGHUP (the trainer handles them and stops its
workers); the server dies with the trainer and the workers with the server
(PR_SET_PDEATHSIG on Linux; otherwise the server ends when its socket closes, and kills its
workers). A worker flushes its stdout and stderr after each call and before it exits, so
what a function prints is not lost when output goes to a file. If the server dies (killed
from outside), the next worker start forks a new one from the trainer as it is then.

Not specified by any paper: our choice. Costs: a fork for the server, one per worker start
(from the small server), JSON both ways per call (measured on the tiny model,
2026-12-01: median 0.33 ms per call against 0.27 ms in a thread); the function cannot use a
CUDA context the trainer created (use `reward_isolation: thread` for a reward model on the
GPU, or for a function that must change state in the trainer's process). A model object
handed to the Python API was loaded before the reward set existed: the server holds its
pages (one stale copy in all, not one per worker).
"""

from __future__ import annotations

import gc
import json
import math
import os
import select
import signal
import socket
import struct
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from replayrl.rollout.rewards.values import RewardCallError, check_shape, check_value

_HEADER = struct.Struct("!Q")
MAX_MESSAGE = 1 << 30  # a reply larger than 1 GiB is not a list of floats
_CRASH_SIGNALS = {signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT, signal.SIGILL, signal.SIGFPE}
_UNKNOWN = "ended (its exit status is unknown)"
# the trainer's ends of workers' pipes and servers' sockets: a process forked from the
# trainer closes them (their EOF must not wait for it)
_holders: weakref.WeakSet[Any] = weakref.WeakSet()


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


def _wait_readable(fd: int, deadline: float) -> None:
    """Until `fd` can be read (or is closed); _Timeout at `deadline`. poll(), not select():
    select() refuses a descriptor >= 1024 (FD_SETSIZE), which a process with many open files
    gets."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise _Timeout
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    if not poller.poll(math.ceil(left * 1000)):
        raise _Timeout


def _read_exact(fd: int, n: int, deadline: float | None) -> bytes | None:
    """`n` bytes from `fd`; None at end of file (the other side is gone)."""
    chunks, got = [], 0
    while got < n:
        if deadline is not None:
            _wait_readable(fd, deadline)
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


def _flush() -> None:
    """Write out what this process's stdout and stderr hold (it ends by os._exit or SIGKILL,
    which do not flush: a reward's prints to a file would be lost)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):  # closed, or a broken pipe: nothing to save
            pass


def _fork() -> int:
    _flush()  # else the child's first flush repeats this process's pending output
    with warnings.catch_warnings():  # "multi-threaded, fork() may deadlock": see _child
        warnings.simplefilter("ignore", DeprecationWarning)
        return os.fork()


def _ignore_signals() -> None:
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # the trainer's to handle; it stops us


def _die_with_parent(parent: int) -> None:
    """SIGKILL when the parent process ends (Linux); a hung function must not outlive it."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # the parent died before the line above
        os._exit(0)


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
        _flush()  # what the call printed, before its reply: a kill after it loses nothing
        _send(replies, reply)


def _line_buffered() -> None:
    """Each line a function prints is written at once: a call that hangs (and is killed)
    or crashes keeps what it printed before, whole lines at least."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(line_buffering=True)  # type: ignore[union-attr]
        except (AttributeError, OSError, ValueError):  # not a text file: flushed per call
            pass


def _child(fn: Callable[..., Any], requests: int, replies: int, parent: int) -> None:
    _ignore_signals()
    _die_with_parent(parent)
    _line_buffered()
    if "torch" in sys.modules:  # torch's thread pool does not survive a fork (DataLoader too)
        sys.modules["torch"].set_num_threads(1)
    _serve(fn, requests, replies)


# -- the fork server's side ------------------------------------------------------------------


def _send_control(sock: socket.socket, obj: Any, fds: Sequence[int] = ()) -> None:
    data = json.dumps(obj).encode() + b"\n"
    sent = socket.send_fds(sock, [data], list(fds)) if fds else sock.send(data)
    if sent < len(data):
        sock.sendall(data[sent:])


def _receive_control(sock: socket.socket) -> tuple[Any, list[int]]:
    """One newline-ended JSON message and the descriptors sent with it; (None, []) at EOF.
    One message at a time is in flight (request, then reply), so none run together."""
    data, fds, _, _ = socket.recv_fds(sock, 4096, 2)
    while data and not data.endswith(b"\n"):
        more = sock.recv(4096)
        data = data + more if more else b""  # closed mid-message: as good as EOF
    if not data:
        for fd in fds:
            os.close(fd)
        return None, []
    return json.loads(data), fds


def _how(status: int) -> str:
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        sig = signal.Signals(-code)
        crash = " (a crash in native code)" if sig in _CRASH_SIGNALS else ""
        return f"was killed by {sig.name}{crash}"
    return f"exited with code {code} (os._exit, or an exit from native code)"


def _reap(pid: int, grace_s: float) -> str:
    """End worker `pid` (SIGKILL after `grace_s`) and say how it had ended."""
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
    except (ChildProcessError, ProcessLookupError):
        return _UNKNOWN
    return "was stopped"


def _fork_worker(fn: Callable[..., Any], sock: socket.socket, fds: list[int]) -> int:
    """Fork `fn`'s worker on the pipe ends `fds` (requests in, replies out)."""
    requests, replies = fds
    server = os.getpid()
    pid = _fork()
    if pid == 0:  # the worker: never returns into the server's loop
        code = 0
        try:
            sock.close()
            _child(fn, requests, replies, server)
        except BaseException:  # noqa: BLE001 - nothing to report to; the trainer sees EOF
            code = 1
        finally:
            _flush()
            os._exit(code)
    return pid


def _answer(fns: Sequence[Callable[..., Any]], sock: socket.socket, live: set[int]) -> bool:
    """One request from the trainer: start a worker or stop one; False at EOF."""
    msg, fds = _receive_control(sock)
    if msg is None:
        return False
    if msg["op"] == "start":
        try:
            pid = _fork_worker(fns[msg["fn"]], sock, fds)
            live.add(pid)
            reply: dict[str, Any] = {"pid": pid}
        except OSError as exc:  # out of processes or memory: the trainer raises it
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        finally:
            for fd in fds:
                os.close(fd)
    else:
        live.discard(msg["pid"])
        reply = {"how": _reap(msg["pid"], msg["grace_s"])}
    _send_control(sock, reply)
    return True


def _run_server(fns: Sequence[Callable[..., Any]], sock: socket.socket, parent: int) -> None:
    """Fork workers until the trainer closes its socket, then kill those still running."""
    _ignore_signals()
    _die_with_parent(parent)
    gc.freeze()  # the trainer's objects: a collection here would write (copy) their pages
    live: set[int] = set()
    try:
        while _answer(fns, sock, live):
            pass
    finally:
        for pid in live:
            _reap(pid, 0.0)


# -- the trainer's side ----------------------------------------------------------------------


def _close_inherited() -> None:
    """In a process just forked from the trainer: close the trainer's ends of the pipes and
    sockets of its workers and servers (a worker sees EOF only once all copies close)."""
    for holder in list(_holders):
        holder.close_in_child()


def _end_server(pid: int, sock: socket.socket) -> None:
    sock.close()  # the server kills its workers and exits at EOF
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


def _close_all(fds: tuple[int, ...]) -> None:
    """A collected worker's pipes: it sees EOF and exits (its server reaps it, at the latest
    when the server ends). No request to the server here: a finalizer can run in the middle
    of another request."""
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


class ForkServer:
    """A process forked now, while the trainer is small, that forks reward workers running
    `fns[i]`; the trainer talks to it over a Unix socket, one request at a time."""

    def __init__(self, fns: Sequence[Callable[..., Any]]) -> None:
        self.fns = list(fns)
        self.pid: int | None = None
        self.sock: socket.socket | None = None
        self.starts = 0  # servers forked (the first, then one after each death)
        self._lock = threading.Lock()  # a request and its reply are one exchange
        self._finalizer: weakref.finalize | None = None
        self.start()

    def start(self) -> None:
        ours, theirs = socket.socketpair()
        parent = os.getpid()
        pid = _fork()
        if pid == 0:  # the server: never returns into the trainer's code
            code = 0
            try:
                ours.close()
                _close_inherited()
                _run_server(self.fns, theirs, parent)
            except BaseException:  # noqa: BLE001 - nothing to report to; the trainer sees EOF
                code = 1
            finally:
                os._exit(code)
        theirs.close()
        self.pid, self.sock = pid, ours
        self.starts += 1
        self._finalizer = weakref.finalize(self, _end_server, pid, ours)
        _holders.add(self)

    def close_in_child(self) -> None:
        if self.sock is not None:
            self.sock.close()

    def stop(self) -> None:
        """End the server (and so every worker it forked)."""
        if self._finalizer is not None:
            self._finalizer()
        self.pid = self.sock = None

    def _exchange(self, msg: dict[str, Any], fds: Sequence[int] = ()) -> Any:
        """Send one request; its reply, or None if the server is gone."""
        if self.sock is None:
            return None
        try:
            _send_control(self.sock, msg, fds)
            reply, _ = _receive_control(self.sock)
        except (BrokenPipeError, ConnectionResetError):
            reply = None
        if reply is None:
            self.stop()
        return reply

    def start_worker(self, index: int, fds: Sequence[int]) -> int:
        """Fork a worker for `fns[index]` on these pipe ends; its pid. A server found dead
        is forked again first (from the trainer as it is now)."""
        with self._lock:
            reply = self._exchange({"op": "start", "fn": index}, fds)
            if reply is None:
                self.start()
                reply = self._exchange({"op": "start", "fn": index}, fds)
        if reply is None:
            raise OSError("the reward functions' fork server died at once after its start")
        if "error" in reply:
            raise OSError(f"could not fork a reward worker process: {reply['error']}")
        return int(reply["pid"])

    def stop_worker(self, pid: int, grace_s: float) -> str:
        """End worker `pid` (SIGKILL after `grace_s`); how it had ended."""
        with self._lock:
            reply = self._exchange({"op": "stop", "pid": pid, "grace_s": grace_s})
        return _UNKNOWN if reply is None else str(reply["how"])


def live_servers() -> list[ForkServer]:
    """The fork servers of this process that are running."""
    return [h for h in list(_holders) if isinstance(h, ForkServer) and h.pid is not None]


class RewardWorker:
    """A reward function in its own process, forked from `server` (which runs
    `server.fns[index]`, this `fn`); `call` is one TRL-style call."""

    def __init__(self, fn: Callable[..., Any], name: str, server: ForkServer, index: int) -> None:
        self.fn, self.name = fn, name
        self.server, self.index = server, index
        self.pid: int | None = None
        self.requests = self.replies = -1
        self.starts = 0  # workers forked (the first, then one after each death or timeout)
        self._finalizer: weakref.finalize | None = None

    def start(self) -> None:
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        try:
            pid = self.server.start_worker(self.index, (req_r, rep_w))
        except BaseException:
            os.close(req_w)
            os.close(rep_r)
            raise
        finally:  # the worker's ends: the server passed them on
            os.close(req_r)
            os.close(rep_w)
        self.pid, self.requests, self.replies = pid, req_w, rep_r
        self.starts += 1
        self._finalizer = weakref.finalize(self, _close_all, (req_w, rep_r))
        _holders.add(self)

    def close_in_child(self) -> None:
        for fd in (self.requests, self.replies):
            if fd >= 0:
                os.close(fd)

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
        _holders.discard(self)
        return self.server.stop_worker(pid, grace_s)

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
