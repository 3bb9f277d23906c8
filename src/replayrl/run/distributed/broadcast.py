"""Weight sync by collective broadcast: the learner (rank 0) sends its trainable weights to
the generator processes over a torch.distributed group (NCCL between GPUs, as OpenRLHF and
verl do; gloo on CPU), instead of a host copy pickled through an object store and unpickled
in every actor.

The weights travel in the generation dtype (what the generators sample in: a bf16 engine
gets bf16, half the bytes of fp32), packed into one flat buffer per dtype so a sync is one
collective, not one per tensor. The receiving model copies them into its own parameters
(`load_trainable`): a generator sampling in that dtype sees the same weights either way.
"""

from __future__ import annotations

import datetime
import pickle
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from replayrl.run.distributed.ddp import free_port, process_group_backend
from replayrl.run.distributed.weights import load_trainable, trainable_state

Layout = list[tuple[str, torch.Size, int]]  # (name, shape, numel) in buffer order


def layout_of(state: dict[str, torch.Tensor]) -> Layout:
    """Names, shapes and sizes of `state` in a fixed order: both ends derive the same one
    from the same model, so only the flat buffer travels."""
    return [(n, t.shape, t.numel()) for n, t in sorted(state.items())]


def pack(state: dict[str, torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """The tensors of `state` as one flat buffer of `dtype` (layout_of's order), on their
    device."""
    return torch.cat([state[n].detach().reshape(-1).to(dtype) for n, _, _ in layout_of(state)])


def unpack(flat: torch.Tensor, layout: Layout) -> dict[str, torch.Tensor]:
    """The inverse of `pack`: views of `flat` shaped as `layout` says."""
    if flat.numel() != sum(n for _, _, n in layout):
        raise ValueError(f"weight broadcast: {flat.numel()} numbers for {len(layout)} tensors")
    out, offset = {}, 0
    for name, shape, n in layout:
        out[name] = flat[offset : offset + n].view(shape)
        offset += n
    return out


def send_weights(model: torch.nn.Module, dtype: torch.dtype, group: Any = None) -> int:
    """Rank 0: broadcast `model`'s trainable weights in `dtype`; returns the bytes sent."""
    flat = pack(dict(_trainable(model)), dtype)
    dist.broadcast(flat, src=0, group=group)
    return flat.numel() * flat.element_size()


def receive_weights(model: torch.nn.Module, dtype: torch.dtype, group: Any = None) -> None:
    """A generator rank: receive rank 0's broadcast into `model` (same architecture)."""
    params = dict(_trainable(model))
    layout = layout_of(params)
    device = next(iter(params.values())).device
    flat = torch.empty(sum(n for _, _, n in layout), dtype=dtype, device=device)
    dist.broadcast(flat, src=0, group=group)
    load_trainable(model, unpack(flat, layout))


@dataclass
class PairGroup:
    """A two-rank process group of its own: the learner (rank 0) and one generator (rank 1).

    Built from its own TCPStore, not the default process group, which a data-parallel learner
    already holds (torch allows one per process). One group per generator, not one for all:
    asynchronous generators finish their batches at different times, and a collective over
    all of them would wait for the slowest; a replaced generator gets a new pair."""

    store: Any  # kept alive with the group
    group: Any

    @classmethod
    def open(cls, host: str, port: int, rank: int, backend: str, timeout_s: float) -> PairGroup:
        """Both ranks call this at about the same time (it returns once both have joined);
        rank 0 serves the store on `port`."""
        timeout = datetime.timedelta(seconds=timeout_s)
        store = dist.TCPStore(host, port, 2, rank == 0, timeout=timeout, wait_for_workers=False)
        if backend == "nccl":
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            return cls(store, dist.ProcessGroupNCCL(store, rank, 2, options))
        if backend != "gloo":
            raise ValueError(f"weight broadcast: backend {backend!r} (nccl or gloo)")
        return cls(store, dist.ProcessGroupGloo(store, rank, 2, timeout))

    def broadcast(self, flat: torch.Tensor) -> None:
        """Rank 0's `flat` into rank 1's (same size and dtype); raises on a lost peer once the
        group's timeout passes, never hangs."""
        options = dist.BroadcastOptions()
        options.rootRank, options.rootTensor = 0, 0
        self.group.broadcast([flat], options).wait()


def receive_flat(
    group: PairGroup, layout: Layout, dtype: torch.dtype, device: torch.device
) -> dict[str, torch.Tensor]:
    """Rank 1 of `group`: the learner's packed weights, unpacked by the learner's `layout`
    (names and shapes checked again when they are loaded: `load_trainable`)."""
    flat = torch.empty(sum(n for _, _, n in layout), dtype=dtype, device=device)
    group.broadcast(flat)
    return unpack(flat, layout)


def _trainable(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def object_store_sync(source: torch.nn.Module, target: torch.nn.Module, dtype: torch.dtype) -> int:
    """The fallback path, as Ray's object store does it: a host copy in `dtype`, serialised,
    deserialised in the actor and copied into its model; returns the bytes serialised."""
    blob = pickle.dumps(trainable_state(source, dtype), protocol=5)
    load_trainable(target, pickle.loads(blob))  # bytes made just above, in this process
    return len(blob)


def _bench_rank(rank: int, world: int, port: int, model: Any, dtype: Any, n: int, out: Any):
    dist.init_process_group(
        process_group_backend(next(model.parameters()).device),
        init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
    )  # fmt: skip
    try:
        times, sent = [], 0
        for _ in range(n):
            dist.barrier()
            t0 = time.perf_counter()
            if rank == 0:
                sent = send_weights(model, dtype)
            else:
                receive_weights(model, dtype)
            dist.barrier()
            times.append(time.perf_counter() - t0)
        if rank == 0:
            out.put({"bytes": sent, "seconds": min(times)})
        else:
            # raw bytes: a tensor would travel as a shared-memory handle of a process that is
            # about to exit
            state = trainable_state(model)
            out.put({"weights": {k: _raw(v) for k, v in state.items()}})
    finally:
        dist.destroy_process_group()


def broadcast_sync_figures(
    source: torch.nn.Module, receivers: list[torch.nn.Module], dtype: torch.dtype, repeats: int = 3
) -> tuple[dict[str, float], list[dict[str, torch.Tensor]]]:
    """One broadcast group of `source` (rank 0) and `receivers` (one process each, spawned):
    ({bytes, seconds} of the fastest of `repeats` syncs, the weights each receiver holds)."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    world, port = 1 + len(receivers), free_port()
    procs = [
        ctx.Process(target=_bench_rank, args=(r, world, port, m, dtype, repeats, out))
        for r, m in enumerate([source, *receivers])
    ]
    for p in procs:
        p.start()
    results = [out.get() for _ in procs]
    for p in procs:
        p.join(timeout=60)
    if any(p.exitcode != 0 for p in procs):
        raise RuntimeError(f"weight broadcast: ranks exited {[p.exitcode for p in procs]}")
    figures = next(r for r in results if "bytes" in r)
    received = [
        {k: _from_raw(*v) for k, v in r["weights"].items()} for r in results if "weights" in r
    ]
    return figures, received


def _raw(t: torch.Tensor) -> tuple[bytes, torch.dtype, tuple[int, ...]]:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes(), t.dtype, tuple(t.shape)


def _from_raw(data: bytes, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dtype).reshape(shape)


def weight_sync_figures(model: torch.nn.Module, dtype: torch.dtype, repeats: int = 3) -> dict:
    """Bytes and seconds per sync of both paths, to one generator copy of `model` (CPU:
    gloo). The object-store path counts host copy + serialise + deserialise + copy in."""
    import copy

    target = copy.deepcopy(model)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        size = object_store_sync(model, target, dtype)
        times.append(time.perf_counter() - t0)
    broadcast, _ = broadcast_sync_figures(model, [copy.deepcopy(model)], dtype, repeats)
    backend = process_group_backend(next(model.parameters()).device)
    return {
        "dtype": str(dtype).removeprefix("torch."),
        "object_store": {"bytes": size, "seconds": min(times)},
        f"broadcast_{backend}": broadcast,
    }
