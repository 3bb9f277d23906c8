"""The reasoning suite's analysis scripts under benchmarks/: rollouts to fixed accuracies and
the chain warm start's step kinds."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest


def _script(name: str):
    path = Path(__file__).resolve().parent.parent / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"{name}_script", path)
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def _run(folder: Path, accs: list[float]) -> None:
    """A finished run evaluated every 256 generated rollouts."""
    folder.mkdir(parents=True)
    evals = [
        {"eval/accuracy": a, "rollouts_generated": 256 * i, "wall_seconds": float(i)}
        for i, a in enumerate(accs)
    ]
    (folder / "summary.json").write_text(json.dumps({"evals": evals}))


def test_rollouts_to_takes_the_median_first_crossing_per_variant(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _run(tmp_path / "grpo-s0", [0.3, 0.6, 0.85, 0.9])
    _run(tmp_path / "grpo-s1", [0.3, 0.5, 0.8, 0.95])
    _run(tmp_path / "grpo-s2", [0.3, 0.82, 0.7, 0.9])  # crosses 0.8 early, then drops
    _run(tmp_path / "remix-grpo-s0", [0.3, 0.9, 0.9, 0.9])
    _run(tmp_path / "remix-grpo-s1", [0.3, 0.7, 0.7, 0.7])  # never reaches 0.8
    (tmp_path / "replay-s0").mkdir()  # unfinished: no summary.json, left out
    assert _script("rollouts_to").main([str(tmp_path), "0.8", "0.95"]) == 0
    out = capsys.readouterr().out
    # grpo: 0.8 first at 512, 512, 256 -> 512; 0.95 only in s1 (768) -> median is never
    assert "| grpo | 3 | 512 | never |" in out
    # remix: 256 and never -> the upper neighbour (never an optimistic median)
    assert "| remix-grpo | 2 | never | never |" in out
    assert "replay |" not in out


def test_chain_step_kind_carries_and_borrows() -> None:
    kind = _script("chain_steps").step_kind
    assert kind(27, "+", 5) == ("+", "1d", "carry")
    assert kind(21, "+", 5) == ("+", "1d", "nocarry")
    assert kind(21, "-", 5) == ("-", "1d", "carry")  # 1 < 5: a borrow
    assert kind(45, "-", 19) == ("-", "2d", "carry")
    assert kind(45, "-", 13) == ("-", "2d", "nocarry")
