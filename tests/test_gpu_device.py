"""On a CUDA GPU (skipped without one; scripts/gpu_check.sh runs them): a run's parts train
and generate on the GPU, `precision: auto` picks bf16 there, the learner's processes group
on NCCL. On CPU: scripts/gpu_check.py's own code, small."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from replayrl.models.device import model_device
from replayrl.run.components import build_components
from tiny import tiny_config

ROOT = Path(__file__).resolve().parents[1]


def _gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.gpu
def test_a_step_runs_on_the_gpu(tmp_path):
    cfg = tiny_config(tmp_path, "train.device=cuda", "algorithm.advantage=gae", "kl.beta=0.1")
    parts = build_components(cfg, log=lambda _: None)
    assert model_device(parts.model).type == "cuda"
    assert model_device(parts.learner.critic).type == "cuda"
    rollouts = parts.producer.produce(0, step=0, group_base=0).rollouts
    assert rollouts and all(r.completion_ids.device.type == "cpu" for r in rollouts)
    metrics = parts.learner.train_step(rollouts, np.random.default_rng(0), step=0)
    assert np.isfinite(metrics["loss"])
    assert all(p.device.type == "cuda" for p in parts.model.parameters())


@pytest.mark.gpu
def test_precision_auto_is_bf16_on_a_bf16_gpu(tmp_path):
    cfg = tiny_config(tmp_path, "train.device=cuda")
    parts = build_components(cfg, log=lambda _: None)
    want = torch.bfloat16 if torch.cuda.is_bf16_supported() else None
    assert parts.learner.precision_choice.learner_autocast == want


@pytest.mark.gpu
def test_bf16_logprob_mismatch_is_small_on_the_gpu(tiny_model):
    out = _gpu_check().logprob_mismatch(tiny_model, tiny_model.config.vocab_size, "cuda")
    assert 0 < out["mean_abs"] < 0.1
    tiny_model.to("cpu")


def test_gpu_check_script_runs_small_on_cpu(tmp_path):
    mod = _gpu_check()
    quick = ["rollout.prompts_per_step=2", "rollout.num_generations=2", "rollout.max_new_tokens=4"]
    quick.append("train.mini_batch_size=4")  # a model.path run's default (TRL's) is 8
    assert (
        mod.main(
            [
                "--out",
                str(tmp_path / "out"),
                "--work",
                str(tmp_path / "work"),
                "--shape",
                "tiny",
                "--device",
                "cpu",
                "--steps",
                "2",
                "--set",
                *quick,
            ]
        )
        == 0
    )
    # only the figures come back from a GPU machine: the model and checkpoints stay in --work
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["gpu_check.json"]
    report = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    for run in ("grpo", "replay"):
        assert report[run]["steps"] == 2 and report[run]["step_s_median"] > 0
        assert report[run]["generated_tokens_per_s"] > 0
    mismatch = report["bf16_vs_fp32_logprobs"]
    assert 0 < mismatch["mean_abs"] <= mismatch["max_abs"]
