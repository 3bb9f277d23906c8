"""A run on a user's data: local model folder, JSONL dataset, reward function from a file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from replayrl.config.schema import ConfigError, load_config
from replayrl.run.metrics import read_metrics
from replayrl.run.start import train


def test_dataset_task_with_local_model_and_file_reward(
    tmp_path: Path, tiny_model, char_tokenizer
) -> None:
    model_dir = tmp_path / "model"
    tiny_model.save_pretrained(model_dir)
    char_tokenizer.save_pretrained(model_dir)
    rows = [{"prompt": f"{a}+{a}=", "answer": str(2 * a)} for a in range(40)]
    rows += [{"prompt": "", "answer": "1"}, {"answer": "2"}, "not a row"]  # 3 malformed rows
    data = tmp_path / "train.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    reward_file = tmp_path / "my_rewards.py"
    reward_file.write_text(
        "def short(prompts, completions, answer, **kw):\n"
        "    return [1.0 if len(c) <= 3 else 0.0 for c in completions]\n"
    )
    cfg = load_config(
        None,
        [
            f"model.path={model_dir}",
            "task.name=dataset",
            f"task.dataset.path={data}",
            "task.eval_size=8",
            f"rewards=[{{name: math}}, {{name: '{reward_file}:short', weight: 0.5}}]",
            "rollout.prompts_per_step=2",
            "rollout.num_generations=4",
            "rollout.max_new_tokens=4",
            "train.steps=2",
            "logging.tensorboard=false",
            "logging.progress=false",
            f"logging.run_dir={tmp_path}",
            "logging.name=run",
        ],
    )
    logs: list[str] = []
    summary = train(cfg, log=logs.append)
    assert summary["steps"] == 2 and summary["rollouts_generated"] == 16
    assert summary["num_eval_prompts"] == 8
    assert any("skipped" in line for line in logs)  # the malformed rows are reported
    step = [m for m in read_metrics(tmp_path / "run" / "metrics.jsonl") if m["step"] == 1][0]
    assert f"reward/{reward_file}:short" in step and "reward/math" in step


def test_dataset_task_needs_a_path_and_a_model() -> None:
    with pytest.raises(ConfigError, match="task.dataset.path"):
        load_config(None, ["task.name=dataset"])
