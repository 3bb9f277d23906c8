"""One sharded learner step on CPU (gloo, spawned ranks), with what FSDP2 did recorded per rank:
the mesh, each parameter's local shard shape, the dtype of the sharded (master) parameters, of
the gathered (compute) parameters, of every matmul's inputs during the step and of the AdamW
state, the loss, and the weights after the step (each rank's gathered copy and its local
shards). Shared by tests/test_fsdp_options.py and the `sharded` observer of
tests/test_config_effects.py; a probe of the same config runs once per test process."""

from __future__ import annotations

import copy
import functools
import json
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.multiprocessing as mp
from torch.utils._python_dispatch import TorchDispatchMode

from replayrl.config.schema import Config, ModelConfig
from replayrl.data.rollout_record import Rollout
from replayrl.learner.learner import Learner
from replayrl.models.loading import build_char_tokenizer, build_tiny_model
from replayrl.rollout.generation import HFGenerator, SamplingParams
from replayrl.rollout.tasks import ArithmeticTask
from tiny import as_rollouts

# a collective one rank does not join fails (not hangs); long enough for a loaded 2-core box
GROUP_TIMEOUT_S = 300
MATMULS = ("mm", "addmm", "bmm")


@functools.cache
def setup() -> tuple[torch.nn.Module, int, list[Rollout]]:
    """A 2-layer, 32-wide tiny Llama (two decoder-layer shard groups besides the root), its
    pad id and 12 sampled rollouts (3 prompts x 4) with fixed advantages."""
    tok = build_char_tokenizer(ArithmeticTask().corpus())
    cfg = ModelConfig.model_validate({"tiny": {"num_layers": 2, "hidden_size": 32}})
    model = build_tiny_model(cfg, vocab_size=len(tok), seed=0)
    torch.manual_seed(5)
    samples = HFGenerator(model.eval(), tok).generate(
        ["1+2=", "12+34=", "7+80="], 4, SamplingParams(max_new_tokens=5)
    )
    adv = np.random.default_rng(0).normal(size=len(samples)).tolist()
    return model, int(tok.pad_token_id), as_rollouts(samples, adv)


def rank_rows(batch: list[Rollout], world: int) -> list[Rollout]:
    """The whole batch in the order the ranks hold it (rank r takes rows r, r + world, ...):
    what an unsharded learner steps on to equal the sharded step."""
    return [r for rank in range(world) for r in batch[rank::world]]


class MatmulDtypes(TorchDispatchMode):
    """Counts the input dtypes of every matrix product run while active."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func.overloadpacket.__name__ in MATMULS:
            dtypes = sorted({str(a.dtype) for a in args if isinstance(a, torch.Tensor)})
            self.seen["+".join(dtypes)] += 1
        return func(*args, **(kwargs or {}))


def _layout(learner: Learner) -> dict[str, Any]:
    """The mesh, placements, local shard shapes and dtypes of the sharded policy, and the
    dtypes of decoder layer 0's parameters while its group is gathered."""
    from torch.distributed.tensor import DTensor

    params = dict(learner.model.named_parameters())
    assert all(isinstance(p, DTensor) for p in params.values())
    first = next(iter(params.values()))
    layer = learner.model.model.layers[0]  # type: ignore[union-attr,index]
    layer.unshard()  # the all-gather FSDP runs before the layer's forward
    gathered = sorted({str(p.dtype) for p in layer.parameters()})
    gathered_types = sorted({type(p).__name__ for p in layer.parameters()})
    layer.reshard()
    return {
        "mesh_shape": list(first.device_mesh.shape),
        "mesh_dims": list(first.device_mesh.mesh_dim_names or ()),
        "placements": sorted({str(p.placements) for p in params.values()}),
        "local_shapes": {n: list(p.to_local().shape) for n, p in params.items()},
        "full_shapes": {n: list(p.shape) for n, p in params.items()},
        "master_dtypes": sorted({str(p.dtype) for p in params.values()}),
        "gathered_dtypes": gathered,
        "gathered_types": gathered_types,
    }


def _rank(rank: int, world: int, port: int, cfg: Config, setup_: tuple[Any, ...], out: str) -> None:
    from safetensors.torch import save_file

    from replayrl.run.distributed import fsdp
    from replayrl.run.distributed.ddp import init_group, leave_group

    torch.set_num_threads(1)
    init_group(rank, world, "127.0.0.1", port, timeout_s=GROUP_TIMEOUT_S)
    model, pad, batch = setup_
    learner = Learner(copy.deepcopy(model), pad, cfg)
    fsdp.shard_learner(learner, world)
    record = _layout(learner)
    with MatmulDtypes() as matmuls:
        metrics = learner.train_step(batch[rank::world], np.random.default_rng(rank), step=0)
    record["matmul_dtypes"] = dict(matmuls.seen)
    record["adam_dtypes"] = sorted(
        {str(v.dtype) for s in learner.optimizer.state.values() for v in s.values()}
    )
    loss = torch.tensor([metrics["loss"]], dtype=torch.float64)
    torch.distributed.all_reduce(loss)  # each rank's loss is over its own rows
    record["loss"] = float(loss) / world
    local = {n: p.to_local().detach().clone() for n, p in learner.model.named_parameters()}
    save_file(local, f"{out}/local{rank}.safetensors")
    full = fsdp.full_state(learner.model)  # gathered over this rank's shard group
    save_file({k: v.clone() for k, v in full.items()}, f"{out}/full{rank}.safetensors")
    Path(f"{out}/rank{rank}.json").write_text(json.dumps(record))
    leave_group()


@dataclass(frozen=True)
class Probe:
    ranks: list[dict[str, Any]]  # each rank's record (see `_layout`, plus dtypes and loss)
    local: list[dict[str, torch.Tensor]]  # each rank's local shards after the step
    full: list[dict[str, torch.Tensor]]  # each rank's gathered weights after the step


_PROBES: dict[str, Probe] = {}


def _probe(world: int, cfg: Config) -> Probe:
    from safetensors.torch import load_file

    from replayrl.run.distributed.ddp import free_port

    with tempfile.TemporaryDirectory() as out:
        args = (world, free_port(), cfg, setup(), out)
        mp.spawn(_rank, args=args, nprocs=world, join=True)
        return Probe(
            [json.loads(Path(f"{out}/rank{r}.json").read_text()) for r in range(world)],
            [load_file(f"{out}/local{r}.safetensors") for r in range(world)],
            [load_file(f"{out}/full{r}.safetensors") for r in range(world)],
        )


def probe(cfg: Config) -> Probe:
    """One sharded step of `cfg` on `cfg.workers.learners` ranks (cached per config)."""
    key = cfg.model_dump_json()
    if key not in _PROBES:
        _PROBES[key] = _probe(cfg.workers.learners, cfg)
    return _PROBES[key]


def reference_step(cfg: Config, world: int) -> tuple[float, dict[str, torch.Tensor]]:
    """The unsharded learner's loss and weights after one step on the whole batch."""
    model, pad, batch = setup()
    learner = Learner(copy.deepcopy(model), pad, cfg)
    metrics = learner.train_step(rank_rows(batch, world), np.random.default_rng(0), step=0)
    state = learner.model.state_dict()
    return float(metrics["loss"]), {k: v.detach().clone() for k, v in state.items()}
