"""Generator workers with a real vLLM engine (CPU build, `make test-vllm`; skipped where vLLM is
not installed): the worker keeps no copy of the policy, weights published by the learner go
straight into its engine (async-local's shared memory, the Ray path's state dict), full
fine-tuning and LoRA alike; and an async-local run trains with such a worker."""

from __future__ import annotations

import copy
import gc
import json

import pytest
import torch

pytest.importorskip("vllm", reason="the real-engine tier needs vllm (make test-vllm)")

from replayrl.config.schema import load_config  # noqa: E402
from replayrl.learner.batching import collate  # noqa: E402
from replayrl.learner.logprobs import token_logprobs  # noqa: E402
from replayrl.run.distributed.weights import SharedWeights, trainable_state  # noqa: E402
from replayrl.run.policy import load_policy  # noqa: E402

# the run overrides, and the autouse fixture that keeps each engine small and frees it
from test_vllm_runs import VLLM_RUN, _small_engines  # noqa: E402, F401

pytestmark = pytest.mark.vllm


def mismatch(policy: torch.nn.Module, rollouts: list) -> float:
    """Largest |behaviour - learner| log-prob over the rollouts' completion tokens."""
    batch = collate(rollouts, pad_id=0)
    with torch.no_grad():
        lp, _ = token_logprobs(policy, batch, 1.0)
    mask = batch.mask.bool()
    return (lp[mask] - batch.old_logprobs[mask]).abs().max().item()


def moved(policy: torch.nn.Module, seed: int) -> torch.nn.Module:
    """The policy after some training: every trainable tensor changed."""
    out = copy.deepcopy(policy)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in out.parameters():
            if p.requires_grad:
                p.add_(0.3 * torch.randn(p.shape, generator=g))
    return out


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_worker_feeds_its_engine_and_keeps_no_policy_copy(lora, tmp_path):
    from replayrl.run.distributed.worker import GeneratorWorker

    extra = ["model.lora.enabled=true", "model.lora.r=2", "model.lora.alpha=8"] if lora else []
    over = [*VLLM_RUN, f"logging.run_dir={tmp_path}", "rollout.reward_isolation=thread", *extra]
    cfg = load_config(None, over)
    learner, _, _ = load_policy(cfg.model, cfg.task, log=lambda _: None, seed=cfg.train.seed)
    worker = GeneratorWorker(cfg, 0, log=lambda _: None)
    try:
        # the policy lives in the engine only: the worker's module holds no weights
        assert all(p.is_meta for p in worker.model.parameters())
        # async-local: the learner publishes into shared memory, the worker pulls
        shared = SharedWeights(learner)
        first = moved(learner, seed=1)
        shared.publish(first, version=1)
        worker.pull(shared)
        assert worker.version == 1
        d = worker.produce(idle_s=0.0)
        assert d.version == 1 and len(d.rollouts) == 8
        assert mismatch(first, d.rollouts) < 1e-4
        assert mismatch(learner, d.rollouts) > 1e-2  # the check tells the versions apart
        # the Ray path: a state dict of the trainable tensors
        second = moved(learner, seed=2)
        worker.set_weights(trainable_state(second), version=2)
        d = worker.produce(idle_s=0.0)
        assert {r.policy_version for r in d.rollouts} == {2}
        assert mismatch(second, d.rollouts) < 1e-4
    finally:
        del worker
        gc.collect()


def test_async_local_run_trains_with_an_engine_per_worker(tmp_path):
    from replayrl.run.start import train

    over = [
        *VLLM_RUN,
        f"logging.run_dir={tmp_path}",
        "runtime=async-local",
        "method.name=replay",
        "buffer.capacity=32",
        "train.batch_size=8",
        "train.steps=3",
        "workers.max_staleness=3",
        "workers.on_stale=wait",
    ]
    summary = train(load_config(None, over), log=lambda _: None)
    assert summary["steps"] == 3 and summary["policy_version"] == 3
    assert summary["accounting"]["ledger"]["balanced"]
    rows = [json.loads(line) for line in (tmp_path / "demo" / "metrics.jsonl").open()]
    # batches of rollouts sampled at the learner's current version (age 0): log pi_old the
    # learner recomputes equals the engine's log-probs, so the worker's engine sampled with
    # the weights it was sent
    fresh = [r for r in rows if r.get("batch/age_max") == 0]
    assert fresh and max(r["train/behaviour_mismatch_max"] for r in fresh) < 1e-4
