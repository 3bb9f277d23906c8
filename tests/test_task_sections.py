"""Each task's settings live in its own section, `task.<name>`: the new keys drive the task,
the old flat keys still work with a warning naming the new one, a setting for a task that
is not selected is an error naming its section, and warm-start keys stay what they were."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import yaml

from replayrl.config.schema import ConfigError, build_config, load_config
from replayrl.rollout.tasks import task_from_config

REASONING_NEW = [
    "task.name=reasoning",
    "task.reasoning.op=sub",
    "task.reasoning.digits=4",
    "task.reasoning.min_digits=2",
]
REASONING_OLD = ["task.name=reasoning", "task.op=sub", "task.digits=4", "task.min_digits=2"]


def _quiet(overrides: list[str], config: str | None = None):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a shipped preset or a new key warns of nothing
        return load_config(config, overrides)


def test_a_tasks_section_holds_its_settings_and_drives_the_task() -> None:
    cfg = _quiet(REASONING_NEW)
    assert (cfg.task.settings.op, cfg.task.settings.digits) == ("sub", 4)
    task = task_from_config(cfg.task)
    assert (task.op, task.digits, task.min_digits) == ("sub", 4, 2)
    # only the selected task's section is held (and written to config.yaml)
    dumped = cfg.model_dump(mode="json")["task"]
    assert "reasoning" in dumped and "arithmetic" not in dumped and "op" not in dumped
    assert build_config(cfg.model_dump(mode="json")).task == cfg.task  # round trip
    assert _quiet(["task.arithmetic.digits=1"]).task.settings.digits == 1


def test_old_flat_keys_are_read_with_a_warning_naming_the_new_key() -> None:
    with pytest.warns(FutureWarning, match=r"task.op is now task.reasoning.op") as seen:
        old = load_config(None, REASONING_OLD)
    assert old.task == _quiet(REASONING_NEW).task
    named = {str(w.message).split(" is now ")[1].split()[0] for w in seen}
    assert named == {"task.reasoning.op", "task.reasoning.digits", "task.reasoning.min_digits"}
    with pytest.warns(FutureWarning, match=r"task.digits is now task.arithmetic.digits"):
        assert load_config(None, ["task.digits=1"]).task.settings.digits == 1
    with pytest.raises(ConfigError, match=r"task.op is the old name of task.reasoning.op"):
        load_config(None, ["task.name=reasoning", "task.op=sub", "task.reasoning.op=add"])


def test_a_setting_of_another_task_is_an_error_naming_its_section() -> None:
    with pytest.raises(
        ConfigError,
        match=r"task.reasoning.op: a setting of task.name=reasoning, but the "
        r"selected task is arithmetic",
    ):
        load_config(None, ["task.reasoning.op=sub"])
    with pytest.raises(ConfigError, match=r"task.op='sub' is a setting of task.reasoning.op"):
        load_config(None, ["task.op=sub"])  # flat, for a task that is not selected
    with pytest.raises(ConfigError, match=r"task.path='x.jsonl' is a setting of task.dataset"):
        load_config(None, ["task.name=reasoning", "task.path=x.jsonl"])
    with pytest.raises(ConfigError, match=r"task.colour: no such setting.*task.reasoning.op"):
        load_config(None, ["task.name=reasoning", "task.colour=red"])
    with pytest.raises(ConfigError, match=r"task.reasoning.op: Input should be 'add'"):
        load_config(None, ["task.name=reasoning", "task.reasoning.op=mul"])
    # a preset's section is dropped by name when the command line picks another task
    with pytest.raises(ConfigError, match=r"task.reasoning.digits: a setting of task.name=rea"):
        load_config("reasoning-add", ["task.name=arithmetic"])
    cfg = _quiet(["task.name=arithmetic", "task.reasoning=null"], "reasoning-add")
    assert cfg.task.name == "arithmetic" and cfg.task.settings.digits == 2


def test_a_config_yaml_from_the_flat_layout_still_loads(tmp_path: Path) -> None:
    dataset = {
        "path": "rows.jsonl",
        "eval_path": None,
        "prompt_column": "question",
        "answer_column": "answer",
        "solution_column": "solution",
        "format": "gsm8k",
    }
    # every key of the old section, as a run folder's config.yaml recorded it
    old = {
        "name": "dataset",
        "digits": 2,
        "op": "add",
        "min_digits": 1,
        "terms": 4,
        "eval_size": 0,
        "seed": 0,
        **dataset,
        "chat_template": True,
        "system_prompt": None,
        "reasoning_gym": {"datasets": [], "size": 10000, "config": {}, "weights": {}},
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"task": old}))
    with pytest.warns(FutureWarning, match="task.path is now task.dataset.path"):
        t = load_config(path).task
    assert t.model_dump()["dataset"] == dataset
    # another task's setting away from its default was never used: refused, not dropped
    path.write_text(yaml.safe_dump({"task": {**old, "op": "sub"}}))
    with pytest.raises(ConfigError, match=r"task.op='sub' is a setting of task.reasoning.op"):
        load_config(path)


def test_warm_start_keys_are_those_of_the_flat_layout() -> None:
    from replayrl.run.warmstart import warmstart_key

    # recorded with the flat `task` section, before each task had its own
    recorded = {
        "e78ea0c5705b45e9": (None, []),
        "926cbb8220342862": (None, ["task.arithmetic.digits=1", "task.seed=3"]),
        "a3bf2fb22aa40204": ("reasoning-chain", []),
        "5c8d5c166a3906fc": (
            None,
            [
                "task.name=reasoning",
                "task.reasoning.op=sub",
                "task.reasoning.digits=5",
                "task.reasoning.min_digits=2",
                "task.eval_size=100",
            ],
        ),
    }
    for key, (preset, overrides) in recorded.items():
        cfg = _quiet(overrides, preset)
        assert warmstart_key(cfg.model, cfg.task) == key, (preset, overrides)


def test_shipped_presets_and_suites_use_the_sections() -> None:
    from importlib import resources

    from replayrl.config.catalog import preset_names

    for name in preset_names():
        _quiet([], name)  # no flat key left in a preset: no warning
    folder = Path(str(resources.files("replayrl.config") / "suites"))
    flat = ("task.op=", "task.digits=", "task.min_digits=", "task.terms=", "task.path=")
    for suite in folder.glob("*.yaml"):
        text = suite.read_text()
        assert not [k for k in flat if k in text], suite.name


def test_a_checkpoint_record_in_the_flat_layout_is_compared_in_the_new_one() -> None:
    from replayrl.run.records.folder import in_current_layout

    record = {"task": {"name": "reasoning", "op": "sub", "digits": 4, "terms": 4}, "x": 1}
    now = in_current_layout(record)
    assert now["x"] == 1 and now["task"]["reasoning"]["op"] == "sub"
    new = ["task.name=reasoning", "task.reasoning.op=sub", "task.reasoning.digits=4"]
    assert now["task"] == _quiet(new).task.model_dump(mode="json")
    broken = {"task": {"name": "reasoning", "op": "mul"}}
    assert in_current_layout(broken) == broken  # left as it is for the comparison to report
