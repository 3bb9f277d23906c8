"""runtime: ray. Generator workers, the buffer and the learner as Ray actors.

The driver (`replayrl train runtime=ray`) starts or joins Ray, places a learner actor by
`ray.learner_num_cpus/gpus`, and waits. The learner actor runs the same AsyncTrainer loop as
async-local; its generators are actors placed by `ray.generator_num_cpus/gpus`, its buffer
an actor (`ray.buffer_num_cpus`). Weights travel through Ray's object store as one object
per sync, or by a broadcast between GPUs (`ray.weight_sync`, run/distributed/weight_sync.py).
The run folder must be on a filesystem the learner's node can write (sharded learners,
`train.sharding: fsdp`: one every learner node shares, as each rank writes its own
checkpoint shards there).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from replayrl.config.schema import Config, build_config, config_to_yaml
from replayrl.errors import RunFailed, RunStopped
from replayrl.learner.critic import policy_frozen
from replayrl.models.device import model_device, resolve_device
from replayrl.models.precision import choose_for
from replayrl.run.components import buffer_kwargs, build_learner
from replayrl.run.distributed.broadcast import Layout, PairGroup, receive_flat
from replayrl.run.distributed.ddp import free_port, init_group, weights_digest
from replayrl.run.distributed.fsdp_learner import (
    FullWeightsPool,
    ShardedLeader,
    ShardedOutputs,
    follow_gather,
    is_sharded,
    join_learners,
    load_learner_shards,
    save_learner_shards,
)
from replayrl.run.distributed.gpus import hide_gpus_unless_given, ray_gpu_requests
from replayrl.run.distributed.placement import alive_nodes, check_placement
from replayrl.run.distributed.ray_settings import ray_settings
from replayrl.run.distributed.weight_sync import BroadcastSender, weight_sync_path
from replayrl.run.distributed.weights import trainable_state
from replayrl.run.distributed.worker import GeneratorWorker
from replayrl.run.loops.asynchronous import AsyncSession, run_async, staleness_bounded
from replayrl.run.loops.pool import Delivery
from replayrl.run.records.ledger import RoleClock, format_accounting
from replayrl.run.session import StopOnSignal, signal_name
from replayrl.storage.checkpoint import latest_checkpoint
from replayrl.storage.io import quiet_transformers

Log = Callable[[str], None]
_POLL_S = 0.2  # how often the driver checks for Ctrl-C while the learner actor runs
# a bound on one call to a buffer or learner actor: an actor that neither answers nor dies
# (a stuck node) fails the run instead of hanging it
_CALL_TIMEOUT_S = 600.0
_EVAL_TIMEOUT_S = 3600.0  # an evaluation of a large model on a generator


def _ray():
    try:
        import ray
    except ImportError as exc:  # pragma: no cover - the `ray` extra is installed by make
        raise ImportError(
            "runtime=ray needs Ray: pip install 'replayrl[ray]' (or pip install ray)"
        ) from exc
    return ray


_quiet = quiet_transformers


def _get(refs: Any, what: str, timeout: float = _CALL_TIMEOUT_S, why: str = "") -> Any:
    """`ray.get` bounded by `timeout`; a dead actor or a call past the bound is a RunFailed
    naming `what`, then `why` (the run folder's guard adds the newest complete checkpoint)."""
    ray = _ray()
    try:
        return ray.get(refs, timeout=timeout)
    except ray.exceptions.RayTaskError:
        raise  # the call itself failed (its class also names the cause's): not a lost actor
    except ray.exceptions.GetTimeoutError as exc:
        raise RunFailed(f"{what} did not answer within {timeout:g} s{why}") from exc
    except ray.exceptions.RayActorError as exc:
        raise RunFailed(f"{what} died mid-run ({type(exc).__name__}){why}") from exc


# -- actors (plain classes; wrapped with ray.remote where they are created) ------------------
class GeneratorActor:
    """A GeneratorWorker in a Ray actor; `generate` returns one delivery as plain data."""

    def __init__(self, cfg_yaml: str, worker_id: int, incarnation: int) -> None:
        _quiet()
        hide_gpus_unless_given(_ray().get_gpu_ids())  # ray.generator_num_gpus=0: no GPU
        cfg = build_config(yaml.safe_load(cfg_yaml))

        def log(msg: str) -> None:
            print(f"[generator {worker_id}] {msg}", flush=True)

        self.worker = GeneratorWorker(cfg, worker_id, incarnation, log=log)
        self.idle_since = time.perf_counter()

    def pid(self) -> int:
        return os.getpid()

    def join_weights(
        self, host: str, port: int, backend: str, timeout_s: float, layout: Layout
    ) -> None:
        """Rank 1 of a weight-broadcast pair with the learner (ray.weight_sync=broadcast)."""
        device = self.worker.device  # the model's, or the engine's (no model copy)
        if backend == "nccl" and device.type != "cuda":
            raise RuntimeError(
                "ray.weight_sync=broadcast: the learner sends over NCCL (GPU) but this "
                f"generator's model is on {device}; give generators GPUs "
                "(ray.generator_num_gpus) or set ray.weight_sync=object_store"
            )
        self.pair, self.layout = PairGroup.open(host, port, 1, backend, timeout_s), layout

    def receive_weights(self, version: int, dtype: str) -> None:
        device = self.worker.device  # the model's, or the engine's (no model copy)
        dt = getattr(torch, dtype.removeprefix("torch."))
        self.worker.set_weights(receive_flat(self.pair, self.layout, dt, device), version)

    def evaluate(
        self, rows: list[dict[str, Any]], weights: dict | None, version: int
    ) -> dict[str, float]:
        """The held-out evaluation of policy `version` (its weights first, when given), with
        the version this generator holds as `policy_version`."""
        if weights is not None:
            self.worker.set_weights(weights, version)
        try:
            return {**self.worker.evaluate(rows), "policy_version": self.worker.version}
        finally:
            self.idle_since = time.perf_counter()  # evaluating is not waiting for work

    def generate(self, weights: dict | None, version: int) -> dict[str, Any]:
        t0 = time.perf_counter()
        if weights is not None:
            self.worker.set_weights(weights, version)
        d = self.worker.produce(idle_s=t0 - self.idle_since)
        self.idle_since = time.perf_counter()
        return d.to_plain()


class BufferActor:
    """The replay buffer / on-policy queue, held by its own actor."""

    def __init__(self, kind: str, capacity: int | None, kwargs: dict[str, Any]) -> None:
        from replayrl.data.buffer import make_buffer

        self.buffer = make_buffer(kind, capacity, **kwargs)

    def call(self, method: str, *args: Any) -> Any:
        return getattr(self.buffer, method)(*args)

    def size(self) -> int:
        return len(self.buffer)


class RemoteBuffer:
    """The Buffer interface over a BufferActor (what AsyncTrainer sees).

    A dead buffer actor fails the run: it is not restarted, since a new one would be empty
    and the loop would go on training on whatever arrived next; `--resume` restores the
    buffer from the newest checkpoint instead."""

    def __init__(self, handle: Any, kind: str, name: str = "the buffer actor") -> None:
        self.handle, self.kind, self.name = handle, kind, name

    def _call(self, method: str, *args: Any) -> Any:
        return self._answer(self.handle.call.remote(method, *args))

    def _answer(self, ref: Any) -> Any:
        why = ": not restarted, as a new one would be empty; --resume restores its rollouts"
        return _get(ref, self.name, why=why)

    def push(self, rollouts: list) -> None:
        if rollouts:
            self._call("push", rollouts)

    def sample(self, n: int, current_version: int | None = None) -> list:
        return self._call("sample", n, current_version)

    def __len__(self) -> int:
        return int(self._answer(self.handle.size.remote()))

    def stats(self) -> dict[str, float]:
        return self._call("stats")

    def state_dict(self) -> dict[str, Any]:
        return self._call("state_dict")

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._call("load_state_dict", state)


class ShardedRemoteBuffer:
    """T buffer actors, one per learner (paper 1's sharding): each delivery goes to one shard,
    round-robin; learner r samples shard r. `len` is T x the smallest shard, so "len >= B"
    means every learner can draw its B / T."""

    def __init__(self, shards: list[RemoteBuffer]) -> None:
        self.shards, self.kind, self.next = shards, shards[0].kind, 0

    def push(self, rollouts: list) -> None:
        if rollouts:
            self.shards[self.next % len(self.shards)].push(rollouts)
            self.next += 1

    def sample(self, n: int, current_version: int | None = None) -> list:
        """Rank 0's share (n = 0 drops stale rollouts in every shard)."""
        if n == 0:
            for sh in self.shards:
                sh.sample(0, current_version)
            return []
        return self.shards[0].sample(n, current_version)

    def __len__(self) -> int:
        return len(self.shards) * min(len(sh) for sh in self.shards)

    def stats(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for sh in self.shards:
            for k, v in sh.stats().items():
                out[k] = out.get(k, 0.0) + v
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"shards": [sh.state_dict() for sh in self.shards], "next": self.next}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for sh, st in zip(self.shards, state["shards"], strict=True):
            sh.load_state_dict(st)
        self.next = int(state["next"])


class FollowerActor:
    """Learner rank r > 0: a replica of the policy (or, under train.sharding=fsdp, its shard)
    that trains on its own shard's B / T and averages gradients with the other ranks."""

    def __init__(self, cfg_yaml: str, rank: int, world: int, policy_path: str | None) -> None:
        _quiet()
        hide_gpus_unless_given(_ray().get_gpu_ids())  # its own GPU (cuda:0 here), or none
        from replayrl.run.policy import load_policy

        cfg = build_config(yaml.safe_load(cfg_yaml))
        if cfg.train.threads:
            torch.set_num_threads(cfg.train.threads)
        model_cfg = cfg.model.model_copy(update={"path": policy_path}) if policy_path else cfg.model
        with torch.random.fork_rng():  # the same weights as rank 0 (same path / warm start)
            self.model, tok, path = load_policy(
                model_cfg, cfg.task, seed=cfg.train.seed, device=resolve_device(cfg.train.device)
            )
        self.model = self.model.to(resolve_device(cfg.train.device))
        self.learner = build_learner(_per_rank(cfg, world), self.model, tok.pad_token_id, path)
        self.rank, self.world = rank, world
        self.rng = np.random.default_rng(cfg.train.seed + 1 + rank)
        self.epochs = cfg.train.epochs

    def join(self, address: str, port: int) -> None:
        init_group(self.rank, self.world, address, port, device=model_device(self.model))
        join_learners(self.learner, self.world)

    def load_learner_state(self, state: dict[str, Any]) -> None:
        """A resumed run's learner state, before `join` (a sharded learner takes it then)."""
        self.learner.load_state_dict(state)

    def gather(self, parts: tuple[str, ...]) -> None:
        """Join rank 0's gather of the full weights or optimizer state (sharded learners)."""
        follow_gather(self.learner, parts)

    def save_shards(self, folder: str) -> None:
        """Write this rank's shards into a checkpoint being written (sharded learners)."""
        save_learner_shards(self.learner, Path(folder))

    def load_shards(self, folder: str) -> None:
        """Load this rank's shards of a resumed checkpoint, once sharded."""
        load_learner_shards(self.learner, Path(folder))

    def train_step(self, shard: Any, n: int, version: int, step: int) -> dict[str, float]:
        t0 = time.perf_counter()
        batch = _ray().get(shard.call.remote("sample", n, version))
        self.learner.version = version
        self.learner.train_step(
            batch,
            self.rng,
            step=step,
            epochs=self.epochs,
            policy_frozen=policy_frozen(
                step, self.learner.cfg.critic.warmup_steps, self.learner.critic is not None
            ),
        )
        return {
            "busy_s": time.perf_counter() - t0,
            "rollouts": len(batch) * self.epochs,
            "tokens": sum(r.completion_ids.numel() for r in batch) * self.epochs,
        }

    def shuffle_state(self) -> dict[str, Any]:
        """This rank's mini-batch shuffle generator, for a checkpoint."""
        return dict(self.rng.bit_generator.state)

    def load_shuffle_state(self, state: dict[str, Any]) -> None:
        """A resumed run's shuffle generator: the rank's mini-batches go on as they would
        have, not from the seed again."""
        self.rng.bit_generator.state = state

    def digest(self) -> str:
        return weights_digest(self.model)


def _per_rank(cfg: Config, world: int) -> Config:
    """Each of T learners updates on B / T rollouts (mini-batches split the same way)."""
    if world == 1:
        return cfg
    out = cfg.model_copy(deep=True)
    mini = cfg.train.mini_batch_size
    if mini is not None:
        out.train.mini_batch_size = max(1, mini // world)
    return out


class RayGeneratorPool:
    """W generator actors kept busy with `generate` calls; a dead actor is replaced."""

    def __init__(self, cfg: Config, log: Log) -> None:
        self.cfg, self.log = cfg, log
        self.ray = _ray()
        self.cfg_yaml = config_to_yaml(cfg)
        rc = ray_settings(cfg)
        self.actor_cls = self.ray.remote(
            num_cpus=rc.generator_num_cpus,
            num_gpus=rc.generator_num_gpus,
            resources=rc.generator_resources,
            max_restarts=0,  # the pool restarts it, up to workers.max_restarts (see _replace)
        )(GeneratorActor)
        self.actors: list[Any] = []
        self.incarnations: list[int] = []
        self.restart_counts: list[int] = []
        self.synced: list[int] = []  # weights version each actor holds
        self.pending: dict[Any, int] = {}  # ref -> worker id
        self.weights: Any = None
        self.version = -1
        self.hold = self.paused = False
        self.lost = 0
        self._pids: dict[str, int] = {}
        self.sync_path = weight_sync_path(cfg)
        self.sender = BroadcastSender(self.ray, cfg.workers.startup_timeout)
        self.evaluations = 0  # held-out evaluations run on generator 0 (`evaluate`)

    def _new_actor(self, worker_id: int, incarnation: int) -> Any:
        a = self.actor_cls.options(name=None).remote(self.cfg_yaml, worker_id, incarnation)
        self._pids[f"generator/{worker_id}"] = self.ray.get(
            a.pid.remote(), timeout=self.cfg.workers.startup_timeout
        )
        return a

    def ensure_actors(self) -> None:
        """The W generator actors, started one at a time (each one kept as it is made, so
        `close` ends those made before a failed start)."""
        if not self.actors:
            W = self.cfg.workers.generators
            self.incarnations, self.restart_counts, self.synced = [0] * W, [0] * W, [-1] * W
            for i in range(W):
                self.actors.append(self._new_actor(i, 0))

    def start(self) -> None:
        self.ensure_actors()  # the runtime may have made them before the first evaluation
        self._submit()

    def _sync(self, i: int) -> Any:
        """What generator `i`'s next call carries: the published weights through the object
        store if it lacks them (else None), or, on the broadcast path, nothing after they
        are broadcast to it now."""
        if self.synced[i] == self.version:
            return None
        if self.sync_path == "broadcast":
            self.sender.send(i, self.actors[i], self.version)
            return None
        return self.weights

    def evaluate(
        self,
        rows: list[dict[str, Any]],
        model: Any = None,
        version: int | None = None,
        dtype: torch.dtype | None = None,
    ) -> dict[str, float]:
        """Generator 0 evaluates on `rows` (what sharded learners do: they hold no whole
        policy to evaluate with): the published policy, or `model` of `version` when the
        learner has moved past it (off the `workers.sync_every` grid), sent to generator 0
        alone so the others keep their sync schedule. A batch generator 0 is generating
        finishes first (an actor runs one call at a time); the pool submits nothing new
        meanwhile. A generator 0 lost on the way is replaced (a restart, as in `poll`) and
        the evaluation runs on the replacement."""
        self.ensure_actors()
        self.evaluations += 1
        try:
            try:
                return self._evaluate_on_0(rows, model, version, dtype)
            except self.ray.exceptions.RayActorError as exc:
                for ref in [r for r, i in self.pending.items() if i == 0]:
                    del self.pending[ref]  # its batch in flight is counted lost by _replace
                self._replace(0, exc)
            return self._evaluate_on_0(rows, model, version, dtype)  # on the replacement
        except self.ray.exceptions.GetTimeoutError as exc:
            raise RunFailed(
                f"an evaluation on generator 0 did not end within {_EVAL_TIMEOUT_S:g} s"
            ) from exc
        except self.ray.exceptions.RayActorError as exc:
            raise RunFailed(f"generator 0 was lost twice in an evaluation: {exc}") from exc

    def _evaluate_on_0(
        self, rows: list[dict[str, Any]], model: Any, version: int | None, dtype: Any
    ) -> dict[str, float]:
        actor = self.actors[0]
        if model is not None and version is not None and version != self.version:
            if dtype is None:
                dtype = choose_for(self.cfg.precision, model).generation
            weights, at = self.ray.put(trainable_state(model, dtype)), version
            self.synced[0] = -1  # its next batch gets the published weights again
        else:
            if self.sync_path == "broadcast" and self.synced[0] != self.version:
                # a broadcast needs generator 0 idle: its batch in flight ends first (its
                # delivery stays pending for `poll`)
                busy = [r for r, i in self.pending.items() if i == 0]
                if busy:
                    self.ray.wait(busy, num_returns=len(busy), timeout=_EVAL_TIMEOUT_S)
            weights, at = self._sync(0), self.version
            self.synced[0] = self.version
        result = self.ray.get(actor.evaluate.remote(rows, weights, at), timeout=_EVAL_TIMEOUT_S)
        return result  # type: ignore[no-any-return]

    def publish(self, model: Any, version: int, dtype: torch.dtype | None = None) -> None:
        # in the generation dtype: what the generators sample in (a bf16 sampler: half the
        # bytes through the object store; run/distributed/broadcast.py is the collective path);
        # sharded learners give it, decided on their own policy (fsdp_learner.py)
        dtype = dtype if dtype is not None else choose_for(self.cfg.precision, model).generation
        if self.sync_path == "broadcast":
            self.sender.snapshot(model, dtype)  # sent to each generator before its next batch
        else:
            self.weights = self.ray.put(trainable_state(model, dtype))
        self.version = version

    def _submit(self) -> None:
        if self.hold or self.paused or self.version < 0:
            return
        busy = set(self.pending.values())
        for i, a in enumerate(self.actors):
            if i in busy:
                continue
            try:
                new = self._sync(i)
            except (
                self.ray.exceptions.RayActorError,
                self.ray.exceptions.GetTimeoutError,
            ) as exc:
                self._replace(i, exc, lost=0)  # gone while idle: nothing of it in flight
                continue  # the replacement is synced at the next poll
            except Exception as exc:  # not a lost generator: a broken setting or group
                raise RunFailed(f"weight broadcast to generator {i} failed: {exc}") from exc
            self.pending[a.generate.remote(new, self.version)] = i
            self.synced[i] = self.version

    def poll(self) -> list[Delivery]:
        out: list[Delivery] = []
        if self.pending:
            ready, _ = self.ray.wait(list(self.pending), num_returns=len(self.pending), timeout=0)
            for ref in ready:
                i = self.pending.pop(ref)
                try:
                    out.append(Delivery.from_plain(self.ray.get(ref)))
                except self.ray.exceptions.RayActorError as exc:
                    self._replace(i, exc)
        self._submit()
        return out

    def _replace(self, i: int, exc: Exception, lost: int | None = None) -> None:
        """Generator `i` died; `lost`: rollouts of its batch in flight (default: one batch)."""
        lost = self.cfg.rollouts_per_step if lost is None else lost
        self.lost += lost
        self.sender.forget(i)
        self.ray.kill(self.actors[i])  # one that timed out may live on, holding its resources
        if self.restart_counts[i] >= self.cfg.workers.max_restarts:
            raise RunFailed(
                f"generator worker {i} died after {self.restart_counts[i]} restarts "
                f"(workers.max_restarts={self.cfg.workers.max_restarts}): {exc}"
            )
        self.log(
            f"generator worker {i} died mid-run ({type(exc).__name__}); {lost} rollouts of "
            "its batch in progress counted as lost; restarting it"
        )
        self.incarnations[i] += 1
        self.restart_counts[i] += 1
        self.actors[i] = self._new_actor(i, self.incarnations[i])
        self.synced[i] = -1

    def check(self) -> list[Delivery]:
        return []  # deaths surface as errors on pending calls (poll)

    def set_hold(self, hold: bool) -> None:
        self.hold = hold
        self._submit()  # released: start idle generators now, not at the next poll

    def pause(self, paused: bool) -> None:
        self.paused = paused

    def stop(self) -> list[Delivery]:
        """Let calls in flight finish (their rollouts are kept) and start no more; the actors
        stay for a last evaluation until `close`."""
        self.hold = True
        out: list[Delivery] = []
        deadline = time.monotonic() + 120
        while self.pending and time.monotonic() < deadline:
            out += self.poll()
            time.sleep(0.01)
        self.lost += self.cfg.rollouts_per_step * len(self.pending)  # did not finish in time
        self.pending.clear()
        return out

    def close(self) -> None:
        """End the actors."""
        for a in self.actors:
            self.ray.kill(a)
        self.actors = []

    def pids(self) -> dict[str, int]:
        return dict(self._pids)

    def restarts(self) -> dict[str, int]:
        return {f"generator/{i}": n for i, n in enumerate(self.restart_counts)}

    def sync_figures(self) -> dict[str, Any]:
        """The weight path and, for the broadcast, syncs, bytes and seconds so far."""
        if self.sync_path == "broadcast":
            return {"path": "broadcast", "backend": self.sender.backend, **self.sender.figures}
        return {"path": "object_store"}


class RayAsyncTrainer(AsyncSession):
    """An AsyncSession with a buffer actor and generator actors (runs inside LearnerActor);
    with sharded learners, checkpoints and evaluation read them through `ShardedOutputs`."""

    def __init__(self, cfg: Config, run_dir: Path, log: Log = print, resume: bool = False):
        self.sharded_outputs = ShardedOutputs(cfg)
        # ranks 1..T-1's shuffle generators as a resumed checkpoint kept them (`_restore`)
        self.resumed_shuffles: list[dict[str, Any]] | None = None
        self.ray_pool: RayGeneratorPool | None = None  # the generator actors, once made

        def new_pool(_: Any) -> RayGeneratorPool:
            # its actors now, not inside the starting policy's evaluation (eval_seconds)
            self.ray_pool = RayGeneratorPool(cfg, log)
            self.ray_pool.ensure_actors()
            return self.ray_pool

        super().__init__(
            cfg, run_dir, new_pool, log=log, resume=resume, outputs=self.sharded_outputs
        )
        self.external_stop = threading.Event()
        self.followers: list[Any] = []

    def make_buffer(self, cfg: Config) -> Any:
        """Buffer actors (one shard per learner) instead of an in-process buffer."""
        cfg = staleness_bounded(cfg)
        b, T = cfg.buffer, cfg.workers.learners
        kind = cfg.method_spec.buffer  # the method's kind of buffer
        rc = ray_settings(cfg)
        cls = _ray().remote(num_cpus=rc.buffer_num_cpus, resources=rc.buffer_resources)(BufferActor)
        kwargs = buffer_kwargs(cfg)
        shards = [
            RemoteBuffer(
                cls.remote(
                    kind,
                    None if b.capacity is None else b.capacity // T,
                    {
                        **kwargs,
                        "num_shards": b.num_shards if T == 1 else 1,
                        "seed": kwargs["seed"] + 1000 * r,
                    },
                ),
                kind,
                "the buffer actor" if T == 1 else f"buffer shard {r}",
            )
            for r in range(T)
        ]
        return shards[0] if T == 1 else ShardedRemoteBuffer(shards)

    def _state(self) -> dict[str, Any]:
        state = super()._state()
        if self.followers:  # ranks 1..T-1 shuffle their own mini-batches
            state["follower_shuffle_rng"] = _get(
                [f.shuffle_state.remote() for f in self.followers], "a learner rank"
            )
        return state

    def _restore(self, ckpt: Path) -> dict[str, Any]:
        state = super()._restore(ckpt)
        self.resumed_shuffles = state.get("follower_shuffle_rng")  # older checkpoints: none
        return state

    def run(self) -> dict[str, Any]:
        if self.cfg.workers.learners > 1:
            self._start_followers()
        try:
            return run_async(self)
        finally:
            if self.ray_pool is not None:
                self.ray_pool.close()

    def evaluate(self) -> dict[str, float]:
        """Sharded learners hold no whole policy: generator 0 evaluates, not a gathered copy
        on rank 0's device. It evaluates the published weights when they are the learner's
        (a sync just sent them), else the learner's weights gathered now and sent to it
        alone. Other learners evaluate themselves, as a session does."""
        leader = self.sharded_outputs.leader
        if leader is None:
            return super().evaluate()
        pool, version = self.ray_pool, self.learner.version
        if pool is None:
            raise RuntimeError("sharded learners evaluate on a generator: no generator pool yet")
        if pool.version == version:
            metrics = pool.evaluate(self.eval_rows)
        else:
            dtype = leader.sync_dtype()
            metrics = pool.evaluate(self.eval_rows, leader.sync_model(dtype), version, dtype)
        held = metrics.pop("policy_version")
        if held != version:  # an evaluation of other weights than the learner's is no result
            raise RunFailed(
                f"generator 0 evaluated policy version {held}, not the learner's {version}"
            )
        return metrics

    def summary(self) -> dict[str, Any]:
        out = super().summary()
        sync_figures = getattr(self.pool, "sync_figures", None)  # a sharded run wraps the pool
        if sync_figures is not None:
            out["weight_sync"] = sync_figures()
        if self.ray_pool is not None:
            out["evaluations_on_generators"] = self.ray_pool.evaluations
        if (
            self.followers and self.sharded_outputs.leader is None
        ):  # data parallelism: identical replicas
            digests = {weights_digest(self.model)} | set(
                _get([f.digest.remote() for f in self.followers], "a data-parallel learner")
            )
            out["learners_in_sync"] = len(digests) == 1
            if len(digests) != 1:
                self.log("warning: the data-parallel learners' weights differ")
        return out

    def report_accounting(self, summary: dict[str, Any]) -> None:
        pass  # the driver prints it (an actor's last lines can be cut at shutdown)

    def _start_followers(self) -> None:
        """Ranks 1..T-1 as actors; rank 0 (this actor) joins the same process group."""
        ray, cfg, T = _ray(), self.cfg, self.cfg.workers.learners
        ckpt = latest_checkpoint(self.run_dir) if self.counters.step else None
        rc = ray_settings(cfg)
        cls = ray.remote(
            num_cpus=rc.learner_num_cpus,
            num_gpus=rc.learner_num_gpus,
            resources=rc.learner_resources,
        )(FollowerActor)
        policy = str(ckpt / "policy") if ckpt is not None else None
        self.followers = [cls.remote(config_to_yaml(cfg), r, T, policy) for r in range(1, T)]
        if self.counters.step:  # resumed: the optimizer state too (sharding keeps it)
            state = self.sharded_outputs.follower_state(
                self.learner
            )  # less the shards every rank loads once joined
            _get([f.load_learner_state.remote(state) for f in self.followers], "a learner rank")
            self._restore_shuffles()
        address, port = ray.util.get_node_ip_address(), free_port()
        joins = [f.join.remote(address, port) for f in self.followers]
        init_group(0, T, address, port, device=self.learner.device)
        self.learner.cfg = _per_rank(cfg, T)  # the followers' learners are built with it
        join_learners(self.learner, T)
        _get(joins, "a learner rank joining the process group")
        if is_sharded(cfg):
            leader = ShardedLeader(self.learner, self.followers, ray)
            self.sharded_outputs.shard(leader)
            inner = self.pool_factory  # publishing gathers the full weights from now on
            self.pool_factory = lambda s: FullWeightsPool(inner(s), leader)
            self.log(f"{T} sharded learners (FSDP2), one buffer shard each")
        else:
            self.log(f"{T} data-parallel learners (torch.distributed), one buffer shard each")

    def _restore_shuffles(self) -> None:
        """The followers' shuffle generators from the checkpoint, when it kept one per rank."""
        saved = self.resumed_shuffles
        if saved is None:
            self.log("note: the checkpoint keeps no learner ranks' shuffle state (older run)")
        elif len(saved) != len(self.followers):
            self.log(
                f"note: the checkpoint kept {len(saved) + 1} learner ranks' shuffle state, this "
                f"run has {len(self.followers) + 1}: ranks 1.. shuffle from their seeds"
            )
        else:
            pairs = zip(self.followers, saved, strict=True)
            _get([f.load_shuffle_state.remote(s) for f, s in pairs], "a learner rank")

    def learner_step(self, B: int) -> None:
        if not self.followers:
            return super().learner_step(B)
        T, c, version = len(self.followers) + 1, self.counters, self.learner.version
        shards = self.buffer.shards  # type: ignore[attr-defined]
        refs = [
            f.train_step.remote(shards[r].handle, B // T, version, c.step + 1)
            for r, f in enumerate(self.followers, start=1)
        ]
        super().learner_step(B // T)
        for r, res in enumerate(_get(refs, "a data-parallel learner"), start=1):
            clock = self.clocks.setdefault(f"learner/{r}", RoleClock())
            clock.busy_s += res["busy_s"]
            clock.rollouts += res["rollouts"]
            clock.tokens += res["tokens"]
            clock.batches += 1
            # the step trained every rank's share: the run's trained counts hold them all
            c.rollouts_trained += res["rollouts"]
            c.tokens_trained += res["tokens"]
        c.rollouts_sampled += B - B // T  # the followers' shares (rank 0's counted above)

    def stop_requested(self) -> bool:
        return self.external_stop.is_set()


class LearnerActor:
    """Rank-0 learner: runs the whole AsyncTrainer loop; `request_stop` is Ctrl-C's path."""

    def __init__(self, cfg_yaml: str, run_dir: str, resume: bool) -> None:
        _quiet()
        hide_gpus_unless_given(_ray().get_gpu_ids())  # ray.learner_num_gpus=0: no GPU
        cfg = build_config(yaml.safe_load(cfg_yaml))
        cfg.logging.progress = False  # a progress bar does not survive Ray's log forwarding
        self.trainer = RayAsyncTrainer(cfg, Path(run_dir), resume=resume)

    def run(self) -> dict[str, Any]:
        try:
            return self.trainer.run()
        except KeyboardInterrupt:
            ckpt = latest_checkpoint(self.trainer.run_dir)
            return {"interrupted": True, "step": self.trainer.counters.step, "ckpt": str(ckpt)}

    def request_stop(self) -> None:
        self.trainer.external_stop.set()

    def buffers(self) -> list[Any]:
        """The buffer shard actors' handles (to inspect one: `ray.get(h.size.remote())`)."""
        b = self.trainer.buffer
        return [sh.handle for sh in getattr(b, "shards", [b])]


class RayDriver:
    """What `replayrl train runtime=ray` runs in the calling process."""

    def __init__(self, cfg: Config, run_dir: Path, log: Log = print, resume: bool = False):
        self.cfg, self.run_dir, self.log, self.resume = cfg, run_dir, log, resume
        self.signum: int = signal.SIGINT  # the signal that asked the run to stop

    def run(self) -> dict[str, Any]:
        ray = _ray()
        rc = ray_settings(self.cfg)
        started = not ray.is_initialized()
        if started:
            ray.init(
                # None: RAY_ADDRESS (`ray job submit` sets it), else an instance of the run's
                # own, not whichever one happens to run on the machine
                address=rc.address or os.environ.get("RAY_ADDRESS") or "local",
                num_cpus=rc.num_cpus if rc.address is None else None,
                include_dashboard=False,
                logging_level="WARNING",
                log_to_driver=True,
            )
        try:
            self.cfg = self._with_gpu_requests(ray.cluster_resources().get("GPU", 0))
            # before any actor: a run no node can hold is refused, not queued forever
            check_placement(self.cfg, lambda: alive_nodes(ray), self.log)
            rc = ray_settings(self.cfg)
            actor = (
                ray.remote(
                    num_cpus=rc.learner_num_cpus,
                    num_gpus=rc.learner_num_gpus,
                    resources=rc.learner_resources,
                )(LearnerActor)
                .options(max_concurrency=2)
                .remote(config_to_yaml(self.cfg), str(self.run_dir.resolve()), self.resume)
            )
            result = self._wait(ray, actor, actor.run.remote())
            if result.get("interrupted"):
                self.log(  # here, not only in the actor: its last lines can be cut at shutdown
                    f"interrupted at step {result['step']} ({signal_name(self.signum)}): "
                    f"checkpoint written to {result['ckpt']}; resume with --resume "
                    f"{self.run_dir}"
                )
                # the signal that stopped it: the CLI exits 128 + signum (143 for SIGTERM)
                raise RunStopped(self.signum)
            acc = result["accounting"]
            self.log(format_accounting(acc["ledger"], acc))  # the actor's own print may be cut
            if lost := acc["ledger"]["lost_worker_died"]:
                self.log(
                    f"warning: {lost} rollouts lost with dead generator workers or nodes "
                    "(counted in the ledger as lost_worker_died)"
                )
            return result
        finally:
            if started:
                ray.shutdown()

    def _with_gpu_requests(self, cluster_gpus: float) -> Config:
        """The run's config with the GPUs its actors ask for (`ray_gpu_requests`)."""
        cfg, rc = self.cfg, ray_settings(self.cfg)
        learner, generator = ray_gpu_requests(
            cfg.train.device, cfg.rollout.backend, cfg.workers.learners, cfg.workers.generators,
            (rc.learner_num_gpus, rc.generator_num_gpus), cluster_gpus, self.log,
        )  # fmt: skip
        update = {"learner_num_gpus": learner, "generator_num_gpus": generator}
        return cfg.model_copy(update={"ray": rc.model_copy(update=update)})

    def _wait(self, ray: Any, actor: Any, ref: Any) -> dict[str, Any]:
        """The learner actor's result; the first Ctrl-C asks it to stop after its step.

        StopOnSignal installs its own SIGINT handler, as the sync and async-local loops do:
        relying on Python's default KeyboardInterrupt inside `ray.get` ignored Ctrl-C when the
        process started with SIGINT ignored (any background job of a non-interactive shell,
        e.g. a CI script), and the run went on to its last step.
        """
        sent = False
        with StopOnSignal() as stop:
            while not ray.wait([ref], timeout=_POLL_S)[0]:
                if stop.requested and not sent:
                    self.signum = stop.signum
                    self.log("stopping the Ray run after this step (checkpointing)")
                    _get(actor.request_stop.remote(), "the learner actor")
                    sent = True
            return _learner_result(ray, ref)  # a second Ctrl-C ends the driver at once


def _learner_result(ray: Any, ref: Any) -> dict[str, Any]:
    """The finished learner actor's result. A RunFailed it raised comes back as itself (not
    wrapped in Ray's traceback); its death (its node lost, its process killed) is a RunFailed
    too: either way the run folder's guard names the newest complete checkpoint."""
    try:
        return _get(ref, "the learner actor (and the buffer shards and generators it owns)")
    except ray.exceptions.RayTaskError as exc:
        if isinstance(exc.cause, RunFailed):
            raise exc.cause from None
        raise
