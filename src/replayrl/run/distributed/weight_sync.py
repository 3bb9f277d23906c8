"""How the Ray runtime's learner sends weights to its generator actors.

`object_store`: one host copy per sync in the generation dtype, put in Ray's object store and
handed to each generator with its next `generate` call (deserialised there, copied in).
`broadcast`: a collective over a two-rank group per generator (run/distributed/broadcast.py,
`PairGroup`): NCCL between GPUs, as OpenRLHF and verl sync, gloo on CPU. The learner keeps
one packed snapshot of each published version (the version a generator is told it holds is
the one it gets, even while the learner trains on) and sends it to a generator just before
that generator's next batch, when the generator is idle.

`ray.weight_sync: auto` takes the broadcast where the learner and the generators hold a whole
GPU each, the object store otherwise: on CPU the host copy costs nothing extra, NCCL refuses
two ranks on one GPU, and sharded learners gather what they send (the full weights; with LoRA
the adapters) to the host anyway.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from replayrl.config.schema import Config
from replayrl.run.distributed.broadcast import Layout, PairGroup, layout_of, pack
from replayrl.run.distributed.ddp import free_port, process_group_backend
from replayrl.run.distributed.ray_settings import ray_settings


def weight_sync_path(cfg: Config) -> str:
    """`object_store` or `broadcast`, as `ray.weight_sync` says (`auto`: see the module)."""
    rc = ray_settings(cfg)
    if rc.weight_sync != "auto":
        return rc.weight_sync
    if cfg.train.sharding != "none":  # sharded learners gather to the host
        return "object_store"
    # a whole GPU each: NCCL refuses two ranks on one device (fractions share a GPU)
    return (
        "broadcast" if rc.learner_num_gpus >= 1 and rc.generator_num_gpus >= 1 else "object_store"
    )


class BroadcastSender:
    """The learner's end of the broadcast path: one `PairGroup` per generator, opened at its
    first sync; `send` raises when the generator is gone (the pool then replaces it and
    `forget`s its pair, so the replacement opens a new one)."""

    def __init__(self, ray: Any, timeout_s: float) -> None:
        self.ray, self.timeout_s = ray, timeout_s
        self.pairs: dict[int, PairGroup] = {}
        self.flat: torch.Tensor | None = None
        self.layout: Layout = []
        self.backend = "gloo"
        self.figures = {"syncs": 0, "bytes": 0, "seconds": 0.0}

    def snapshot(self, model: torch.nn.Module, dtype: torch.dtype) -> None:
        """Pack the trainable weights of the version being published (a copy, on the
        model's device, in `dtype`)."""
        state = {n: p for n, p in model.named_parameters() if p.requires_grad}
        self.layout = layout_of(state)
        self.flat = pack(state, dtype)
        self.backend = process_group_backend(self.flat.device)

    def send(self, worker_id: int, actor: Any, version: int) -> None:
        """The snapshot to generator `worker_id` (idle: no call of it in flight)."""
        assert self.flat is not None, "send before the first snapshot"
        t0 = time.perf_counter()
        # alive and idle before a collective: an NCCL send to a dead peer would not return
        # until the watchdog ends the learner
        self.ray.get(actor.pid.remote(), timeout=self.timeout_s)
        if worker_id not in self.pairs:
            self.pairs[worker_id] = self._open(actor)
        ref = actor.receive_weights.remote(version, str(self.flat.dtype))
        self.pairs[worker_id].broadcast(self.flat)  # on failure the pool `forget`s the pair
        self.ray.get(ref, timeout=self.timeout_s)
        self.figures["syncs"] += 1
        self.figures["bytes"] += self.flat.numel() * self.flat.element_size()
        self.figures["seconds"] += time.perf_counter() - t0

    def forget(self, worker_id: int) -> None:
        self.pairs.pop(worker_id, None)

    def _open(self, actor: Any) -> PairGroup:
        host, port = self.ray.util.get_node_ip_address(), free_port()
        ref = actor.join_weights.remote(host, port, self.backend, self.timeout_s, self.layout)
        pair = PairGroup.open(host, port, 0, self.backend, self.timeout_s)
        self.ray.get(ref, timeout=self.timeout_s)
        return pair
