"""Every key of every registered method's `method.<name>` section, changed on resume:
refused with an error naming the key (its registry entry's `frozen_on_resume`), or the run
resumes and trains a step. Nothing in between (a crash at the first step, silent loss)."""

from __future__ import annotations

import shutil
import typing
import warnings
from pathlib import Path
from typing import Any

import pytest

from replayrl.config.registries import METHODS
from replayrl.config.schema import ConfigError, load_config
from replayrl.run.start import resume, train
from tiny import TINY_RUN

# settings under which a source's state fills within two steps of the tiny run, so that a
# changed key meets a non-empty store (a plugin source runs with its defaults)
FILLS: dict[str, list[str]] = {
    "repo": [
        "method.repo.prompt_pool=8",  # mid-pass at the checkpoint (2 steps x 2 prompts)
        "method.repo.buffer_size=4",
        "method.repo.min_buffer=4",
        "method.repo.num_replays=2",
    ],
    "exgrpo": ["method.exgrpo.start_accuracy=0.0"],
    "dynamic_sampling": [  # rewards with variance: groups kept, trained and carried
        "method.dynamic_sampling.carry_surplus=true",
        "rewards=[{name: digits_format}]",
    ],
    "group_replay": ["method.group_replay.capacity=4"],
    "remix": ["algorithm.loss_type=mix_ppg", "method.remix.reincarnation_step=null"],
    "signal_replay": [  # rewards with variance: signal groups stored, replayed at target 1
        "algorithm.loss_type=mix_ppg",
        "rewards=[{name: digits_format}]",
        "method.signal_replay.target=1.0",
    ],
}


def _candidates(annotation: Any, value: Any) -> list[Any]:
    """Other values for a setting: another choice, a smaller and a larger number."""
    choices = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) is typing.Literal:
        return [c for c in choices if c != value]
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, int):
        return [v for v in (value // 2, value + 1) if v != value]
    if isinstance(value, float):
        return [value / 2, value + 0.1] if value else [0.5]
    if value is None and int in choices:
        return [2]
    if value is None and float in choices:
        return [0.5]
    literals = [
        v for c in choices if typing.get_origin(c) is typing.Literal for v in typing.get_args(c)
    ]
    if value is None and literals:
        return literals
    return []


def _changes(name: str, base: list[str]) -> list[tuple[str, str]]:
    """(key, override) for each key of the source's section, the first value it accepts."""
    section = METHODS.get(name).config
    assert section is not None
    current = load_config("grpo", base).method.section(name)
    out = []
    for key, info in section.model_fields.items():
        for value in _candidates(info.annotation, getattr(current, key)):
            text = "null" if value is None else str(value).lower()
            override = f"method.{name}.{key}={text}"
            try:
                load_config("grpo", [*base, override])
            except ConfigError:
                continue  # a value the source's own check refuses: try the next
            out.append((f"method.{name}.{key}", override))
            break
        else:
            pytest.fail(f"no other valid value found for method.{name}.{key}")
    return out


@pytest.mark.parametrize("name", [n for n in METHODS if METHODS.get(n).config])
def test_each_key_of_a_source_is_refused_or_resumes_and_trains(name: str, tmp_path: Path) -> None:
    warnings.simplefilter("ignore", UserWarning)  # e.g. ExGRPO under grpo_clip
    base = [*TINY_RUN, f"method.name={name}", *FILLS.get(name, [])]
    run = tmp_path / "run"
    cfg = load_config(
        "grpo", [*base, "train.steps=2", f"logging.run_dir={tmp_path}", "logging.name=run"]
    )
    assert train(cfg, log=lambda _: None)["steps"] == 2
    changes = _changes(name, base)
    assert len(changes) == len(METHODS.get(name).config.model_fields)  # type: ignore[union-attr]
    frozen = {f"method.{name}.{k}" for k in METHODS.get(name).frozen_on_resume}
    outcome = {}
    for i, (key, override) in enumerate(changes):
        copy = tmp_path / f"resume{i}"
        shutil.copytree(run, copy)
        try:
            summary = resume(copy, [override, "train.steps=3"], log=lambda _: None)
        except ConfigError as e:
            assert key in str(e) and "fixed by the run's checkpoints" in str(e), (key, e)
            outcome[key] = "refused"
            continue
        assert summary["steps"] == 3 and summary["accounting"]["ledger"]["balanced"], key
        outcome[key] = "trained"
    # what is refused is exactly what the source's registry entry declares
    assert {k for k, v in outcome.items() if v == "refused"} == frozen & set(outcome)
