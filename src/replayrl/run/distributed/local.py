"""async-local: generator workers in their own processes on this machine.

Weights reach workers through shared memory (SharedWeights); rollouts come back as spool
files written atomically, so a worker killed at any instant leaves either a whole batch or
nothing, and the batch it was producing is counted as lost, never silently.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import shutil
import signal
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml

from replayrl.config.schema import Config, build_config, config_to_yaml
from replayrl.errors import RewardFunctionFailed, RunFailed
from replayrl.models.device import model_device
from replayrl.run.distributed.gpus import generator_device, pin_process_to
from replayrl.run.distributed.weights import SharedWeights
from replayrl.run.distributed.worker import GeneratorWorker
from replayrl.run.loops.pool import Delivery
from replayrl.storage.io import quiet_transformers

Log = Callable[[str], None]
_POLL_S = 0.02


class StopFlag:
    """The learner's "stop" to its generators: a lock-free shared byte.

    Not a multiprocessing Event: `Event.is_set()` takes a lock shared with the workers, and a
    worker killed (SIGKILL, OOM) while holding it, e.g. inside its own `is_set()` poll, left
    the learner blocked forever in its next `is_set()` (seen: the async-local killed-generator
    test hung with every learner thread in a futex wait)."""

    def __init__(self, ctx: Any) -> None:
        self._flag = ctx.Value("b", 0, lock=False)

    def set(self) -> None:
        self._flag.value = 1

    def is_set(self) -> bool:
        return bool(self._flag.value)


def _pending(spool: Path, worker_id: int) -> int:
    prefix = f"d-w{worker_id:03d}-"
    return sum(1 for n in os.listdir(spool) if n.startswith(prefix))


def _worker_main(
    cfg_yaml: str,
    worker_id: int,
    incarnation: int,
    shared: SharedWeights,
    spool: str,
    stop: Any,
    hold: Any,
    inflight: Any,
) -> None:
    """Process entry: generate until told to stop; Ctrl-C is the parent's to handle."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # a scheduler's SIGTERM / a closed terminal's SIGHUP reach the whole process group: the
    # learner stops after its step, checkpoints, then stops the workers; a worker killed
    # first would only be restarted. Once the learner asked for the stop, SIGTERM ends it.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143) if stop.is_set() else None)
    spool_dir = Path(spool)
    tag = f"w{worker_id:03d}-i{incarnation:02d}"
    try:
        quiet_transformers()
        cfg = pinned_to_own_gpu(build_config(yaml.safe_load(cfg_yaml)))

        def log(msg: str) -> None:
            print(f"[generator {worker_id}] {msg}", flush=True)

        worker = GeneratorWorker(cfg, worker_id, incarnation, log=log)
        (spool_dir / f"ready-{tag}").write_text(str(os.getpid()))
        idle_since = time.perf_counter()
        parent = os.getppid()
        while not stop.is_set():
            if os.getppid() != parent:  # the learner died (e.g. SIGKILL): do not linger
                return
            if (
                hold.value
                or shared.version.value < 0
                or _pending(spool_dir, worker_id) >= cfg.workers.max_pending_batches
            ):
                time.sleep(_POLL_S)
                continue
            worker.pull(shared)  # into its model, or straight into its engine (vLLM)
            inflight[0], inflight[1] = worker.seq + 1, worker.planned
            t0 = time.perf_counter()
            d = worker.produce(idle_s=t0 - idle_since)
            d.save(spool_dir / f"d-{tag}-{d.seq:07d}.pt")
            inflight[1] = 0
            idle_since = time.perf_counter()
    except RewardFunctionFailed as exc:
        # the run's end, not this worker's: the learner raises it as it is (a restart would
        # only fail again). Written before the traceback, which marks the worker as dead
        fatal = {"name": exc.name, "first_error": exc.first_error, "steps": exc.steps}
        (spool_dir / f"fatal-{tag}").write_text(json.dumps(fatal))
        (spool_dir / f"error-{tag}").write_text(traceback.format_exc())
        raise SystemExit(1) from None
    except BaseException:
        (spool_dir / f"error-{tag}").write_text(traceback.format_exc())
        raise SystemExit(1) from None


@dataclass
class _Slot:
    worker_id: int
    incarnation: int
    process: Any
    inflight: Any  # shared [seq, planned rollouts] of the batch being produced
    delivered_seq: int = 0
    restarts: int = 0


def pinned_to_own_gpu(cfg: Config) -> Config:
    """A worker's config once its process sees only its own GPU (train.device=cuda:N becomes
    cuda:0 of CUDA_VISIBLE_DEVICES=N): a vLLM engine would otherwise take GPU 0."""
    device = pin_process_to(cfg.train.device)
    if device == cfg.train.device:
        return cfg
    return cfg.model_copy(update={"train": cfg.train.model_copy(update={"device": device})})


class LocalGeneratorPool:
    """W worker processes (spawned, so no torch state is forked), restarted when they die."""

    def __init__(self, cfg: Config, run_dir: Path, model: torch.nn.Module, log: Log = print):
        self.cfg, self.log = cfg, log
        self.ctx = mp.get_context("spawn")
        self.shared = SharedWeights(model, self.ctx)
        self.spool = run_dir / "spool"
        shutil.rmtree(self.spool, ignore_errors=True)  # leftovers were accounted at save time
        self.spool.mkdir(parents=True)
        self.stop_event = StopFlag(self.ctx)
        self.hold_flag = self.ctx.Value("b", 0, lock=False)
        self.pause_flag = False
        self.slots: list[_Slot] = []
        self.lost = 0  # rollouts of batches in progress when a worker died
        self.cfg_yaml = config_to_yaml(cfg)
        self.learner_device = model_device(model)

    def worker_config(self, worker_id: int) -> str:
        """The run's config for one worker, with its own device (one GPU per worker where
        the machine has more than the learner's; run/distributed/gpus.py)."""
        device = generator_device(self.learner_device, worker_id, torch.cuda.device_count())
        if device == "cpu" and self.learner_device.type == "cpu":
            return self.cfg_yaml  # CPU runs: the worker reads the run's config as it is
        cfg = self.cfg.model_copy(
            update={"train": self.cfg.train.model_copy(update={"device": device})}
        )
        return config_to_yaml(cfg)

    # -- lifecycle ---------------------------------------------------------------------------
    def _spawn(self, worker_id: int, incarnation: int) -> _Slot:
        inflight = self.ctx.Array("q", 2, lock=False)
        p = self.ctx.Process(
            target=_worker_main,
            args=(
                self.worker_config(worker_id),
                worker_id,
                incarnation,
                self.shared,
                str(self.spool),
                self.stop_event,
                self.hold_flag,
                inflight,
            ),
            name=f"replayrl-generator-{worker_id}",
            daemon=True,
        )
        p.start()
        return _Slot(worker_id, incarnation, p, inflight)

    def start(self) -> None:
        self.slots = [self._spawn(i, 0) for i in range(self.cfg.workers.generators)]
        self._wait_ready(self.slots)

    def _wait_ready(self, slots: list[_Slot]) -> None:
        deadline = time.monotonic() + self.cfg.workers.startup_timeout
        waiting = list(slots)
        while waiting:
            for s in list(waiting):
                if (self.spool / f"ready-{self._tag(s)}").exists():
                    waiting.remove(s)
                elif not s.process.is_alive():
                    raise RunFailed(self._death_message(s, "while starting"))
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"generator worker(s) {[s.worker_id for s in waiting]} not ready after "
                    f"workers.startup_timeout={self.cfg.workers.startup_timeout} s"
                )
            time.sleep(0.05)

    @staticmethod
    def _tag(s: _Slot) -> str:
        return f"w{s.worker_id:03d}-i{s.incarnation:02d}"

    def _death_message(self, s: _Slot, when: str) -> str:
        err = self.spool / f"error-{self._tag(s)}"
        detail = err.read_text().strip().splitlines()[-1] if err.exists() else "no traceback"
        return (
            f"generator worker {s.worker_id} died {when} (exit code {s.process.exitcode}): {detail}"
        )

    def pids(self) -> dict[str, int]:
        return {f"generator/{s.worker_id}": s.process.pid for s in self.slots}

    # -- data and weights --------------------------------------------------------------------
    def publish(self, model: torch.nn.Module, version: int) -> None:
        self.shared.publish(model, version)

    def set_hold(self, hold: bool) -> None:
        """Ask workers not to start new batches (learner has enough; evaluation running)."""
        self.hold_flag.value = int(hold or self.pause_flag)

    def pause(self, paused: bool) -> None:
        self.pause_flag = paused
        self.set_hold(paused)

    def poll(self) -> list[Delivery]:
        """Delivered batches, oldest first; each file is read once and removed."""
        names = sorted(n for n in os.listdir(self.spool) if n.startswith("d-"))
        out = []
        for name in names:
            path = self.spool / name
            d = Delivery.load(path)
            path.unlink()
            for s in self.slots:
                if s.worker_id == d.worker_id and s.incarnation == d.incarnation:
                    s.delivered_seq = max(s.delivered_seq, d.seq)
            out.append(d)
        return out

    def check(self) -> list[Delivery]:
        """Restart dead workers (counting their lost batch); returns their last deliveries."""
        delivered: list[Delivery] = []
        for i, s in enumerate(self.slots):
            if s.process.is_alive() or self.stop_event.is_set():
                continue
            delivered += self.poll()  # whatever it finished before dying
            self._raise_fatal(s)
            seq, planned = int(s.inflight[0]), int(s.inflight[1])
            lost = planned if planned and seq > s.delivered_seq else 0
            self.lost += lost
            if s.restarts >= self.cfg.workers.max_restarts:
                raise RunFailed(
                    self._death_message(s, f"after {s.restarts} restarts")
                    + f" (workers.max_restarts={self.cfg.workers.max_restarts})"
                )
            self.log(
                f"{self._death_message(s, 'mid-run')}; {lost} rollouts of its batch in "
                "progress counted as lost; restarting it"
            )
            new = self._spawn(s.worker_id, s.incarnation + 1)
            new.restarts = s.restarts + 1
            self.slots[i] = new
            self._wait_ready([new])
        return delivered

    def _raise_fatal(self, s: _Slot) -> None:
        """A worker that ended the run (a reward function failing on every call): its error,
        type and message as in the synchronous runtime."""
        path = self.spool / f"fatal-{self._tag(s)}"
        if path.is_file():
            fatal = json.loads(path.read_text())
            raise RewardFunctionFailed(
                str(fatal["name"]), str(fatal["first_error"]), int(fatal["steps"])
            )

    def restarts(self) -> dict[str, int]:
        return {f"generator/{s.worker_id}": s.restarts for s in self.slots}

    def stop(self) -> list[Delivery]:
        """Stop every worker, then collect what they delivered (nothing is left behind)."""
        self.stop_event.set()
        for s in self.slots:
            s.process.join(timeout=60)
            if s.process.is_alive():
                s.process.terminate()
                s.process.join(timeout=10)
        out = self.poll()
        for s in self.slots:  # a worker stopped mid-batch (terminated) lost that batch
            seq, planned = int(s.inflight[0]), int(s.inflight[1])
            if planned and seq > s.delivered_seq:
                self.lost += planned
        return out


def local_pool(session: Any) -> LocalGeneratorPool:
    """The async-local runtime's pool for a session (its config, run folder, policy, log)."""
    return LocalGeneratorPool(session.cfg, session.run_dir, session.model, session.log)
