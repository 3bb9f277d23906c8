"""Whole runs with rollout.backend=vllm on the real engine (CPU build, `make test-vllm`; skipped
where vLLM is not installed): GRPO and experience replay train for 5 steps with the engine
colocated in the learner's process, its weights synced after every step, and a run that
crashes after step 3 and resumes logs exactly what the uninterrupted run logged."""

from __future__ import annotations

import gc
import os

import pytest

pytest.importorskip("vllm", reason="the real-engine tier needs vllm (make test-vllm)")

from tiny import TINY_RUN, crash_and_resume  # noqa: E402

pytestmark = pytest.mark.vllm

# the tiny run, 64 wide (head size 32: the CPU build's attention refuses 16); the engine
# samples in fp32 like the learner, so its log-probs are the learner's
VLLM_RUN = [
    *TINY_RUN,
    "model.tiny.hidden_size=64",
    "model.tiny.intermediate_size=128",
    "rollout.backend=vllm",
    "rollout.max_new_tokens=6",
    "precision.generation=float32",
    "vllm.enforce_eager=true",
    "train.device=cpu",
    "train.threads=1",
    "checkpoint.every=1",
    "rewards=[{name: digits_format}]",  # some groups vary: the tiny model is never right
]


@pytest.fixture(autouse=True)
def _small_engines():
    """~2 GB an engine: 1 GiB of KV cache; engines of finished runs freed before the next."""
    old = os.environ.get("VLLM_CPU_KVCACHE_SPACE")
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = "1"
    yield
    gc.collect()
    if old is None:
        os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)
    else:
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = old


@pytest.mark.parametrize("preset", ["grpo", "replay"])
def test_vllm_run_trains_and_resumes_exactly(preset, tmp_path, monkeypatch):
    whole, resumed, whole_steps, crash_steps = crash_and_resume(
        tmp_path, monkeypatch, preset, VLLM_RUN, steps=5
    )
    assert len(whole_steps) == 5 and crash_steps == whole_steps
    assert resumed["rollouts_generated"] == whole["rollouts_generated"] == 5 * 8
    # after every step's sync the engine samples with the learner's weights: the log pi_old
    # the learner recomputes for each step's fresh rollouts equals the engine's log-probs
    for row in whole_steps:
        assert row["train/behaviour_mismatch_max"] < 1e-4, row
    # it trained (a step whose groups all tie has no gradient)
    assert sum(row["train/grad_norm"] > 0 for row in whole_steps) >= 2
