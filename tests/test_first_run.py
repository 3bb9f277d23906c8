"""What a first run shows and refuses: warm-start progress, the missing-column message."""

from __future__ import annotations

import re

import pytest

from replayrl.config.schema import ModelConfig, TaskConfig
from replayrl.run import warmstart


def test_the_tiny_warm_start_reports_progress_through_both_phases(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("REPLAYRL_CACHE", str(tmp_path / "cache"))
    cfg = ModelConfig.model_validate(
        {"tiny": {"num_layers": 1, "hidden_size": 32, "num_heads": 2, "intermediate_size": 64},
         "warmstart": {"steps": 40, "mistake_steps": 20, "batch_size": 2, "seed": 4242}}
    )  # fmt: skip
    lines: list[str] = []
    warmstart.ensure_warmstart(cfg, TaskConfig(), log=lines.append)
    one = [ln for ln in lines if "phase 1/2" in ln]
    two = [ln for ln in lines if "phase 2/2" in ln]
    # every 1/20 of each phase: step, percent, loss and the time left
    assert [re.search(r"step (\d+)/40", ln)[1] for ln in one] == [str(2 * i) for i in range(1, 21)]
    assert len(two) == 20 and "step 20/20 (100%)" in two[-1]
    assert re.search(r"loss \d+\.\d{3}, \d+:\d\d elapsed, ~\d+:\d\d left", one[0])
    assert lines[0].startswith("building the tiny model's SFT warm start")
    assert lines[-1].startswith("warm start done")


def test_a_missing_prompt_column_names_the_columns_and_the_key_to_set() -> None:
    from replayrl.rollout.tasks import DatasetTask

    rows = [{"question": f"{i}+1=", "answer": str(i + 1), "level": 1} for i in range(30)]
    with pytest.raises(ValueError) as err:
        DatasetTask(rows, eval_size=0)
    text = str(err.value)
    assert "columns question, answer, level" in text
    assert "task.dataset.prompt_column=question" in text
    assert "task__dataset__prompt_column='question'" in text
    assert "answer_column" not in text.split("columns", 1)[1]  # the answer column is there
    # the key it names fixes it
    assert DatasetTask(rows, eval_size=0, prompt_column="question").num_train == 30
