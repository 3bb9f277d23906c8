"""Which GPU each process of a run uses: one per learner rank and one per generator worker
where the machine has enough, and none for a process that was given none."""

from __future__ import annotations

import os
from collections.abc import Callable, MutableMapping, Sequence

import torch

from replayrl.config.registries import BACKENDS


def hide_gpus_unless_given(gpu_ids: Sequence[int | str]) -> None:
    """In a Ray actor, before anything touches CUDA: an actor given no GPU (num_gpus=0) must
    see none (Ray leaves CUDA_VISIBLE_DEVICES alone then, so it would see every GPU and
    `train.device=auto` would put it on GPU 0 beside the processes that were given it).
    `gpu_ids`: ray.get_gpu_ids() of the actor."""
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpu_ids)


def generator_device(learner_device: torch.device | str, worker_id: int, gpu_count: int) -> str:
    """The device of async-local generator worker `worker_id` (a process on the learner's
    machine): the CPU when the learner trains there; else the GPUs other than the learner's,
    one per worker in turn; with a single GPU, the learner's (shared, as in TRL's colocate)."""
    learner = torch.device(learner_device)
    if learner.type != "cuda":
        return "cpu"
    own = learner.index or 0
    others = [i for i in range(gpu_count) if i != own]
    if not others:
        return f"cuda:{own}"
    return f"cuda:{others[worker_id % len(others)]}"


def pin_process_to(device: str, environ: MutableMapping[str, str] = os.environ) -> str:
    """Show this process only GPU `device` ('cuda:N', N counted among the GPUs it sees now)
    and return its name from then on ('cuda:0'); any other device is returned as is.

    A vLLM engine in a process takes the first GPU the process sees (its executor's local
    rank 0), whatever `train.device` says: pinning is how an engine gets its own GPU. Only
    possible before CUDA is initialised (CUDA reads CUDA_VISIBLE_DEVICES once)."""
    if not device.startswith("cuda:"):  # auto, cpu, cuda: nothing names one GPU
        return device
    dev = torch.device(device)
    if torch.cuda.is_initialized():
        raise RuntimeError(f"cannot pin this process to {device}: CUDA is already initialised")
    seen = environ.get("CUDA_VISIBLE_DEVICES")
    ids = [g.strip() for g in seen.split(",")] if seen else None
    if ids is not None and dev.index >= len(ids):
        raise ValueError(f"{device}: this process sees only GPUs {seen}")
    environ["CUDA_VISIBLE_DEVICES"] = ids[dev.index] if ids is not None else str(dev.index)
    return "cuda:0"


def ray_gpu_requests(
    device: str, backend: str, learners: int, generators: int, requested: tuple[float, float],
    cluster_gpus: float, log: Callable[[str], None],
) -> tuple[float, float]:  # fmt: skip
    """(GPUs per learner actor, per generator actor) for a Ray run. An actor given none sees
    none (`hide_gpus_unless_given`), so on a cluster with GPUs a request of 0 would train on
    the CPU (`auto`), fail as if no GPU existed (`cuda`) or crash vLLM. Under `auto` a 0 takes
    1 GPU per actor (said in the log) where the cluster has enough; otherwise refused with the
    keys to set. `requested`: (ray.learner_num_gpus, ray.generator_num_gpus)."""
    learner, generator = requested
    if learners > 1 and 0 < learner < 1:
        raise ValueError(
            f"ray.learner_num_gpus={learner} with workers.learners={learners}: two learner "
            "ranks on one GPU cannot form an NCCL group; use ray.learner_num_gpus=1"
        )
    gpu_engine = BACKENDS.get(backend).needs_gpu
    needs = {"learner": device != "cpu", "generator": device != "cpu" or gpu_engine}
    asked = {"learner": learner, "generator": generator}
    zero = [k for k in asked if needs[k] and asked[k] == 0]
    if cluster_gpus <= 0 or not zero:
        return learner, generator
    keys = " ".join(f"ray.{k}_num_gpus=1" for k in zero)
    taken = {k: (1.0 if k in zero else v) for k, v in asked.items()}
    wanted = learners * taken["learner"] + generators * taken["generator"]
    if device != "auto" or wanted > cluster_gpus:
        raise ValueError(
            f"the Ray cluster has {cluster_gpus:g} GPU(s) but the {' and '.join(zero)} actors ask "
            f"for none, so they would see no GPU (train.device={device}, rollout.backend="
            f"{backend}): set {keys} (fractions share a GPU)"
            + ("" if gpu_engine else ", or train.device=cpu")
        )
    log(f"warning: the Ray cluster has GPUs and {keys.replace('=1', '=0')}: taking {keys}")
    return taken["learner"], taken["generator"]
