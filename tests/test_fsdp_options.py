"""The sharded learner's two layout keys, observed on CPU (gloo, spawned ranks, a 2-layer tiny
Llama; tests/sharded_probe.py records what FSDP2 did on each rank):

- `train.sharding_param_dtype=bfloat16`: the parameters are gathered and every matmul of the
  step runs in bf16, while the sharded master parameters and AdamW's state stay fp32; the step
  differs from the fp32 one slightly and stays finite.
- `train.sharding_replicas=2` on 4 ranks (HSDP): a 2-D mesh (replicate x shard), each
  parameter split over 2 ranks, not 4; the replicas end the step with identical weights, equal
  to the 4-way sharded step and to the unsharded step on the whole batch.

Each spawns its ranks (a minute or more on a loaded 2-core machine): marked slow."""

from __future__ import annotations

import pytest
import torch

from replayrl.config.schema import load_config
from sharded_probe import probe, reference_step, setup

pytestmark = pytest.mark.slow

STEP = ["rollout.prompts_per_step=3", "rollout.num_generations=4", "train.lr=1e-4"]
SHARDED = [*STEP, "runtime=ray", "train.sharding=fsdp"]
FP32 = "torch.float32"
BF16 = "torch.bfloat16"


def test_bfloat16_gathers_and_computes_in_bf16_and_keeps_fp32_master_weights() -> None:
    cfg = load_config(None, [*SHARDED, "workers.learners=2", "train.sharding_param_dtype=bfloat16"])
    p = probe(cfg)
    for rank in p.ranks:
        assert rank["master_dtypes"] == [FP32]  # the sharded parameters AdamW steps
        assert rank["adam_dtypes"] == [FP32]
        assert rank["gathered_types"] == ["Parameter"]  # layer 0 gathered: unsharded tensors
        assert rank["gathered_dtypes"] == [BF16]
        matmuls = rank["matmul_dtypes"]
        assert set(matmuls) == {BF16} and matmuls[BF16] > 0, matmuls  # forward and backward
    for full in p.full:
        assert {str(v.dtype) for v in full.values()} == {FP32}
        assert all(torch.isfinite(v).all() for v in full.values())
    ref_loss, ref = reference_step(load_config(None, STEP), world=2)  # fp32, unsharded
    assert abs(p.ranks[0]["loss"]) > 0
    assert 0 < abs(p.ranks[0]["loss"] - ref_loss) < 0.02 * max(1.0, abs(ref_loss))
    diff = max(float((p.full[0][k] - v).abs().max()) for k, v in ref.items())
    # AdamW's first step moves each weight by about lr (1e-4): bf16 changes some directions
    assert 0 < diff < 3e-4, diff


def _chunk(size: int, parts: int, index: int) -> int:
    """The rows of shard `index` of a `size`-row parameter split `parts` ways (FSDP2's
    torch.chunk split)."""
    return torch.chunk(torch.empty(size), parts)[index].numel()


def test_two_replicas_on_four_ranks_shard_over_two_and_average_across_replicas() -> None:
    hsdp = probe(load_config(None, [*SHARDED, "workers.learners=4", "train.sharding_replicas=2"]))
    flat = probe(load_config(None, [*SHARDED, "workers.learners=4"]))
    for r, (two, four) in enumerate(zip(hsdp.ranks, flat.ranks, strict=True)):
        assert (two["mesh_shape"], two["mesh_dims"]) == ([2, 2], ["replicate", "shard"])
        assert (four["mesh_shape"], four["mesh_dims"]) == ([4], ["shard"])
        assert two["placements"] == ["(Replicate(), Shard(dim=0))"]
        for name, full in two["full_shapes"].items():
            # rank r is shard r % 2 of replica r // 2 (of the flat mesh: shard r)
            assert two["local_shapes"][name] == [_chunk(full[0], 2, r % 2), *full[1:]], name
            assert four["local_shapes"][name] == [_chunk(full[0], 4, r), *full[1:]], name
    # each replica holds the whole policy once: the local shards add up to 2 copies
    held = sum(t.numel() for local in hsdp.local for t in local.values())
    whole = sum(torch.Size(shape).numel() for shape in hsdp.ranks[0]["full_shapes"].values())
    assert held == 2 * whole
    for r in (0, 1):  # the same shard in both replicas: the same weights after the step
        for k, v in hsdp.local[r].items():
            assert torch.equal(v, hsdp.local[r + 2][k]), (r, k)
    _, ref = reference_step(load_config(None, STEP), world=4)
    start = setup()[0].state_dict()
    moved = 0.0
    for k, v in ref.items():
        for full in (*hsdp.full, flat.full[0]):  # every replica, and the 4-way sharded step
            torch.testing.assert_close(full[k], v, atol=1e-6, rtol=0)
        moved = max(moved, float((v - start[k]).abs().max()))
    assert moved > 5e-5  # the step changed the weights: the comparison is not vacuous
