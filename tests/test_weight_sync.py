"""The learner -> generator weight paths of the Ray runtime (run/distributed/weight_sync.py) and
the two-rank broadcast group they use (run/distributed/broadcast.py: PairGroup); the path on a
two-node cluster is in tests/test_ray_cluster.py."""

from __future__ import annotations

import multiprocessing as mp

import pytest
import torch

from replayrl.config.schema import load_config
from replayrl.run.distributed.broadcast import PairGroup, layout_of, pack, receive_flat
from replayrl.run.distributed.ddp import free_port
from replayrl.run.distributed.weight_sync import weight_sync_path


def _receiver(port: int, layout, out) -> None:
    pair = PairGroup.open("127.0.0.1", port, 1, "gloo", 30)
    got = receive_flat(pair, layout, torch.bfloat16, torch.device("cpu"))
    out.put({k: v.float().tolist() for k, v in got.items()})


def test_a_pair_group_sends_the_packed_weights_in_the_generation_dtype() -> None:
    torch.manual_seed(0)
    state = {"b.weight": torch.randn(3, 2), "a.bias": torch.randn(4)}
    port, ctx = free_port(), mp.get_context("spawn")
    out = ctx.SimpleQueue()
    child = ctx.Process(target=_receiver, args=(port, layout_of(state), out))
    child.start()
    pair = PairGroup.open("127.0.0.1", port, 0, "gloo", 30)  # beside the default group
    pair.broadcast(pack(state, torch.bfloat16))
    got = out.get()
    child.join(timeout=30)
    assert child.exitcode == 0
    assert set(got) == set(state)
    for name, t in state.items():  # bf16 on the wire: what a bf16 sampler would load
        assert torch.equal(torch.tensor(got[name]), t.to(torch.bfloat16).float())
        assert torch.tensor(got[name]).shape == t.shape


def test_a_pair_group_refuses_an_unknown_backend() -> None:
    with pytest.raises(ValueError, match="backend 'mpi'"):
        PairGroup.open("127.0.0.1", free_port(), 0, "mpi", 1)


@pytest.mark.parametrize(
    ("keys", "path"),
    [
        ([], "object_store"),  # CPU actors: the host copy costs nothing extra
        (["ray.learner_num_gpus=1"], "object_store"),  # the generators sample on CPU
        (["ray.learner_num_gpus=1", "ray.generator_num_gpus=1"], "broadcast"),
        # NCCL refuses two ranks on one GPU: fractions (a shared GPU) keep the object store
        (["ray.learner_num_gpus=0.5", "ray.generator_num_gpus=0.5"], "object_store"),
        # sharded learners gather the full weights to the host: the object store
        (["train.sharding=fsdp", "workers.learners=2", "train.batch_size=16",
          "ray.learner_num_gpus=1", "ray.generator_num_gpus=1"], "object_store"),
        (["ray.weight_sync=broadcast"], "broadcast"),  # asked for: gloo on CPU
        (["ray.learner_num_gpus=1", "ray.generator_num_gpus=1", "ray.weight_sync=object_store"],
         "object_store"),
    ],
)  # fmt: skip
def test_auto_takes_the_broadcast_only_between_gpus(keys: list[str], path: str) -> None:
    assert weight_sync_path(load_config(None, ["runtime=ray", *keys])) == path


def test_an_unknown_weight_path_is_a_config_error_naming_the_choices() -> None:
    with pytest.raises(ValueError, match="object_store"):
        load_config(None, ["runtime=ray", "ray.weight_sync=nccl"])
