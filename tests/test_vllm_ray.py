"""Sharded learners beside a vLLM generator, on Ray and the real engine (CPU build,
`make test-vllm`; skipped where vLLM or Ray is not installed): `runtime=ray`, two learner
ranks under `train.sharding=fsdp`, one generator actor with a vLLM engine (that it keeps
no HF copy is tests/test_vllm_workers.py's check).

What is checked is what a user of this layout relies on: every rollout the engine sampled
after a weight push carries the log-probs of the policy the learners had at that version
(the weights, gathered from both ranks' shards, reached the engine), every rank wrote its
shards into each checkpoint, and the rollout ledger balances."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

pytest.importorskip("vllm", reason="the real-engine tier needs vllm (make test-vllm)")
pytest.importorskip("ray", reason="the Ray runtime needs ray (make test-vllm installs it)")

from replayrl.config.schema import load_config  # noqa: E402
from replayrl.data.buffer import make_buffer  # noqa: E402
from replayrl.run.components import buffer_kwargs  # noqa: E402
from replayrl.run.loops.asynchronous import staleness_bounded  # noqa: E402
from replayrl.run.start import train  # noqa: E402
from replayrl.storage.checkpoint import load_state  # noqa: E402
from replayrl.storage.sharded_checkpoint import SHARDED_DIR  # noqa: E402
from test_vllm_runs import VLLM_RUN, _small_engines  # noqa: E402, F401
from test_vllm_workers import mismatch  # noqa: E402

pytestmark = pytest.mark.vllm

STEPS = 4
RAY_SHARDED = [
    "model.tiny.num_layers=2",
    "runtime=ray",
    "workers.learners=2",
    "train.sharding=fsdp",
    "method.name=replay",
    "buffer.capacity=64",  # every rollout of the run stays, to be checked afterwards
    "train.batch_size=8",
    "workers.max_staleness=3",
    "ray.num_cpus=2",
    "ray.generator_num_cpus=0.5",
    "ray.learner_num_cpus=0.5",
    f"train.steps={STEPS}",
    "checkpoint.every=1",
    f"checkpoint.keep_last={STEPS}",  # the policy of every version
    "train.lr=1e-3",  # versions far enough apart that the wrong one is seen to be wrong
]


def _buffered_rollouts(cfg, state: dict) -> list:
    """The rollouts of a checkpoint's buffer (one shard per learner rank)."""
    out = []
    cfg = staleness_bounded(cfg)  # the buffer actors' own config
    shards = state["buffer"]["shards"]
    for shard in shards:
        buf = make_buffer(
            cfg.method_spec.buffer, cfg.buffer.capacity // len(shards), **buffer_kwargs(cfg)
        )
        buf.load_state_dict(shard)
        out += buf.sample(len(buf))
    return out


def _policy(ckpt: Path) -> torch.nn.Module:
    """The full policy a checkpoint's HF folder holds (gathered from the ranks' shards)."""
    return AutoModelForCausalLM.from_pretrained(ckpt / "policy", dtype=torch.float32).eval()


def test_sharded_learners_push_their_gathered_weights_into_a_vllm_generator(tmp_path: Path):
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    run_dir = tmp_path / "run"
    cfg = load_config(None, [*VLLM_RUN, *RAY_SHARDED, f"logging.run_dir={run_dir}"])
    train(cfg, log=lambda _: None)
    folder = run_dir / cfg.logging.name
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["steps"] == STEPS and summary["runtime"] == "ray"
    ledger = summary["accounting"]["ledger"]  # every generated rollout accounted for
    assert ledger["balanced"] and ledger["generated"] >= STEPS * 8

    checkpoints = sorted((folder / "checkpoints").glob("step_*"))
    assert [int(c.name.split("_")[1]) for c in checkpoints] == list(range(1, STEPS + 1))
    for ckpt in checkpoints:  # both ranks wrote their own DCP shards; none was gathered
        ranks = {p.name for p in (ckpt / SHARDED_DIR).glob("__*_0.distcp")}
        assert ranks == {"__0_0.distcp", "__1_0.distcp"}, ckpt

    rollouts = _buffered_rollouts(cfg, load_state(checkpoints[-1]))
    by_version: dict[int, list] = {}
    for r in rollouts:
        by_version.setdefault(r.policy_version, []).append(r)
    pushed = sorted(v for v in by_version if v >= 1)
    assert pushed, f"no rollout of pushed weights (versions {sorted(by_version)})"
    for v in pushed:  # the policy at version v is checkpoint step v's HF folder
        gap = mismatch(_policy(checkpoints[v - 1]), by_version[v])
        assert gap < 1e-4, f"version {v}: the engine's log-probs differ by {gap:.2e}"
        other = checkpoints[v] if v < STEPS else checkpoints[v - 2]  # the check can fail:
        assert mismatch(_policy(other), by_version[v]) > 1e-3  # another version is far off
    assert torch.isfinite(torch.tensor([r.reward for r in rollouts])).all()
