"""Sharded learners' checkpoints on Ray (`train.sharding: fsdp`, run/distributed/fsdp_learner.py):
every learner rank writes its own DCP shards of the policy and AdamW into the checkpoint and
loads them back on resume; AdamW's state is never gathered to one rank for a checkpoint.

The first test runs the ranks by hand (this process as rank 0, a follower actor as rank 1)
so that the two runs see the same batches: a run resumed from the step-1 checkpoint takes
the same step 2 as the uninterrupted run. The second runs `replayrl train` end to end."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from replayrl.config.schema import ModelConfig, config_to_yaml, load_config
from replayrl.models.loading import build_tiny_model
from replayrl.rollout.generation import HFGenerator, SamplingParams

# the sharded layout and the AdamW reader are the sharded Ray tests'
from test_ray_fsdp import LAYERS, SHARDED, quiet, sharded_adam
from tiny import TINY_RUN, as_rollouts

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def local_ray():
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="WARNING")
    try:
        yield ray
    finally:
        ray.shutdown()


def _shard_files(folder: Path) -> dict[int, set[str]]:
    """Which rank's DCP file holds each saved entry (from DCP's own metadata)."""
    from torch.distributed.checkpoint import FileSystemReader

    meta = FileSystemReader(str(folder)).read_metadata()
    out: dict[int, set[str]] = {}
    for index, info in meta.storage_data.items():
        rank = int(info.relative_path.split("_")[2])  # "__<rank>_0.distcp"
        out.setdefault(rank, set()).add(index.fqn.split(".")[0])
    return out


class _Ranks:
    """Rank 0 here and rank 1 a follower actor, joined into one sharded learner."""

    def __init__(self, ray: Any, cfg: Any, model: Any, folder: Path, pad: int) -> None:
        from replayrl.run.components import build_learner
        from replayrl.run.distributed.ray_runtime import FollowerActor, _per_rank

        self.ray = ray
        self.follower = ray.remote(num_cpus=0.5)(FollowerActor).remote(
            config_to_yaml(cfg), 1, 2, str(folder)
        )
        self.learner = build_learner(_per_rank(cfg, 2), copy.deepcopy(model), pad, "")

    def join(self, state: dict[str, Any] | None = None) -> Any:
        from replayrl.run.distributed.ddp import free_port, init_group
        from replayrl.run.distributed.fsdp_learner import ShardedLeader, join_learners

        if state is not None:  # what `_start_followers` hands a resumed run's ranks
            self.learner.load_state_dict(state)
            self.ray.get(self.follower.load_learner_state.remote(state))
        port = free_port()
        joined = self.follower.join.remote("127.0.0.1", port)
        init_group(0, 2, "127.0.0.1", port)
        join_learners(self.learner, 2)
        self.ray.get(joined)
        self.leader = ShardedLeader(self.learner, [self.follower], self.ray)
        return self.leader

    def step(self, halves: list[Any], step: int) -> None:
        from replayrl.run.distributed.ray_runtime import BufferActor

        shard = self.ray.remote(num_cpus=0.1)(BufferActor).remote("onpolicy", None, {})
        self.ray.get(shard.call.remote("push", halves[1]))
        stepped = self.follower.train_step.remote(shard, len(halves[1]), step - 1, step)
        self.learner.train_step(halves[0], np.random.default_rng(step), step=step)
        self.ray.get(stepped)

    def full(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """The gathered policy and AdamW state (after the comparison's last step)."""
        from replayrl.run.distributed import fsdp

        weights = self.leader.full_model().state_dict()
        adam = self.leader._with_followers(
            "optimizer",
            lambda: fsdp.full_optimizer_state(self.learner.model, self.learner.optimizer),
        )
        return weights, adam

    def close(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
        self.ray.kill(self.follower)


def test_every_rank_writes_its_shards_and_a_resume_takes_the_uninterrupted_step(
    char_tokenizer, local_ray, tmp_path: Path
) -> None:
    from replayrl.run.distributed.fsdp_learner import sharded_learner_state
    from replayrl.storage.sharded_checkpoint import is_sharded_checkpoint

    cfg = load_config(None, [*TINY_RUN, *LAYERS, *SHARDED, "train.lr=1e-3"])
    tiny = ModelConfig.model_validate({"tiny": {"num_layers": 2, "hidden_size": 32}})
    model = build_tiny_model(tiny, vocab_size=len(char_tokenizer), seed=0)
    folder = tmp_path / "policy"
    model.save_pretrained(folder)
    char_tokenizer.save_pretrained(folder)
    gen = HFGenerator(copy.deepcopy(model).eval(), char_tokenizer)
    torch.manual_seed(5)
    prompts = ["1+2=", "12+34=", "7+80=", "5+5=", "40+2=", "9+19=", "3+3=", "60+6="]
    samples = gen.generate(prompts, 4, SamplingParams(max_new_tokens=5))
    rollouts = as_rollouts(samples, np.random.default_rng(0).normal(size=32).tolist())
    steps = {1: rollouts[:16], 2: rollouts[16:]}
    halves = {s: [b[0::2], b[1::2]] for s, b in steps.items()}
    ckpt = tmp_path / "step_000001" / "learner_shards"

    first = _Ranks(local_ray, cfg, model, folder, char_tokenizer.pad_token_id)
    try:
        leader = first.join()
        first.step(halves[1], 1)
        leader.save_shards(ckpt)
        state = sharded_learner_state(first.learner)
        # the checkpoint gathered nothing: no rank held the whole AdamW state or policy
        assert sum(leader.gathered.values()) == 0
        first.step(halves[2], 2)
        expected_weights, expected_adam = first.full()
    finally:
        first.close()
    assert state["optimizer"] is None  # the state file's part: AdamW is in the shards
    assert is_sharded_checkpoint(ckpt.parent)
    # each rank wrote its own file, holding its shards of the policy and of AdamW
    files = _shard_files(ckpt)
    assert set(files) == {0, 1}
    assert all(parts == {"model", "optim"} for parts in files.values()), files
    assert sorted(p.name for p in ckpt.glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]

    # resumed: fresh ranks built from the initial weights load the step-1 shards
    second = _Ranks(local_ray, cfg, model, folder, char_tokenizer.pad_token_id)
    try:
        leader = second.join(json.loads(json.dumps(state)))
        leader.load_shards(ckpt)
        second.step(halves[2], 2)
        weights, adam = second.full()
    finally:
        second.close()
    moved = max(float((expected_weights[n] - model.state_dict()[n]).abs().max()) for n in weights)
    assert moved > 1e-4  # two steps changed the weights: the comparison is not vacuous
    assert set(weights) == set(expected_weights)
    for name, tensor in weights.items():
        torch.testing.assert_close(tensor, expected_weights[name], atol=1e-6, rtol=1e-5)
    assert adam["state"].keys() == expected_adam["state"].keys()
    for i, entries in adam["state"].items():
        assert float(entries["step"]) == 2.0  # AdamW went on from the checkpoint's step 1
        for k in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(
                entries[k], expected_adam["state"][i][k], atol=1e-7, rtol=1e-5
            )


def _rank_shuffle(cfg: Any, rank: int, steps: int) -> dict[str, Any]:
    """Learner rank `rank`'s shuffle generator after `steps` full steps of B / T rows."""
    rng = np.random.default_rng(cfg.train.seed + 1 + rank)
    for _ in range(steps * cfg.train.epochs):
        rng.permutation(cfg.train.batch_size // cfg.workers.learners)
    return dict(rng.bit_generator.state)


def test_a_sharded_ray_run_checkpoints_shards_per_rank_and_resumes_from_them(
    local_ray, tmp_path: Path
) -> None:
    from replayrl.run.start import resume, train
    from replayrl.storage.checkpoint import check_checkpoint, latest_checkpoint, load_state
    from replayrl.storage.sharded_checkpoint import SHARDED_DIR

    cfg = load_config(
        None, [*TINY_RUN, *LAYERS, *SHARDED, "train.steps=2", f"logging.run_dir={tmp_path}"]
    )
    assert train(cfg, log=quiet)["steps"] == 2
    run = tmp_path / "demo"
    ckpt = latest_checkpoint(run)
    assert ckpt is not None and ckpt.name == "step_000002"
    assert load_state(ckpt)["learner"]["optimizer"] is None  # nothing gathered into it
    files = _shard_files(ckpt / SHARDED_DIR)
    assert set(files) == {0, 1} and all(p == {"model", "optim"} for p in files.values())
    manifest = json.loads((ckpt / "manifest.json").read_text())
    assert {f"{SHARDED_DIR}/__0_0.distcp", f"{SHARDED_DIR}/__1_0.distcp"} <= set(manifest["files"])
    assert {float(s["step"]) for s in sharded_adam(ckpt).values()} == {2.0}

    # rank 1 shuffles its own mini-batches: its generator is kept, one draw a step and epoch
    assert load_state(ckpt)["follower_shuffle_rng"] == [_rank_shuffle(cfg, 1, steps=2)]

    assert resume(run, ["train.steps=3"], log=quiet)["steps"] == 3
    again = latest_checkpoint(run)
    assert again is not None and again.name == "step_000003"
    # the resumed rank went on from its kept generator, not from its seed
    assert load_state(again)["follower_shuffle_rng"] == [_rank_shuffle(cfg, 1, steps=3)]
    # every rank loaded its shards: the resumed AdamW went on from step 2, not from 0
    assert {float(s["step"]) for s in sharded_adam(again).values()} == {3.0}
    (again / SHARDED_DIR / "__1_0.distcp").unlink()  # a lost rank's file: not complete
    assert check_checkpoint(again) == f"missing file {SHARDED_DIR}/__1_0.distcp"
