"""Tests for replayrl.config.schema (defaults, YAML, dotted overrides, errors) and
`replayrl config`."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from replayrl.cli.main import main
from replayrl.config.schema import (
    Config,
    ConfigError,
    build_config,
    config_to_yaml,
    load_config,
    parse_override,
)


def _error(overrides: list[str], path: Path | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides)
    return str(info.value)


# -- defaults and YAML ----------------------------------------------------------------------


def test_defaults_validate_and_round_trip():
    cfg = load_config()
    assert isinstance(cfg, Config)
    assert cfg.train.lr == pytest.approx(1e-4)
    assert cfg.rollout.num_generations == 8
    assert cfg.rollouts_per_step == 16 * 8  # R = prompts_per_step * num_generations
    assert cfg.batch_size == cfg.rollouts_per_step  # B defaults to R
    assert [(r.name, r.weight) for r in cfg.rewards] == [("correctness", 1.0)]
    assert cfg.method.name == "onpolicy" and cfg.method_spec.buffer == "onpolicy"
    # the YAML written into run folders reads back to the same config
    assert build_config(yaml.safe_load(config_to_yaml(cfg))) == cfg


def test_yaml_file_then_overrides(tmp_path: Path):
    path = tmp_path / "run.yaml"
    path.write_text(
        "train: {lr: 0.01, steps: 5}\n"
        "rollout:\n"
        "  num_generations: 4\n"
        "rewards:\n"
        "  - {name: correctness, weight: 2.0}\n"
    )
    cfg = load_config(path)
    assert cfg.train.lr == pytest.approx(0.01)
    assert cfg.train.steps == 5
    assert cfg.rollout.num_generations == 4
    assert cfg.rollout.prompts_per_step == 16  # untouched keys keep their defaults
    assert [(r.name, r.weight) for r in cfg.rewards] == [("correctness", 2.0)]
    # overrides apply on top of the file, key by key
    cfg = load_config(path, ["train.lr=0.5"])
    assert cfg.train.lr == pytest.approx(0.5)
    assert cfg.train.steps == 5


def test_empty_yaml_file_is_defaults(tmp_path: Path):
    path = tmp_path / "empty.yaml"
    path.write_text("# nothing\n")
    assert load_config(path) == load_config()


def test_dotted_overrides_scalars_nested_and_lists():
    cfg = load_config(
        None,
        [
            "train.lr=1e-3",  # YAML 1.1 reads this as a string; pydantic parses the float
            "model.tiny.num_layers=3",
            "model.warmstart.steps=7",
            "logging.tensorboard=false",
            "eval.num_prompts=null",
            "rewards=[{name: correctness, weight: 2}, {name: digits_format, weight: 0.5}]",
            "train.seed=1",
            "train.seed=2",  # the last override of a key wins
        ],
    )
    assert cfg.train.lr == pytest.approx(1e-3)
    assert cfg.model.tiny.num_layers == 3
    assert cfg.model.tiny.hidden_size == 128  # siblings of an overridden key are kept
    assert cfg.model.warmstart.steps == 7
    assert cfg.model.warmstart.mistake_steps == 150
    assert cfg.logging.tensorboard is False
    assert cfg.eval.num_prompts is None
    assert [(r.name, r.weight) for r in cfg.rewards] == [
        ("correctness", 2.0),
        ("digits_format", 0.5),
    ]
    assert cfg.train.seed == 2


def test_parse_override_splits_key_and_parses_value():
    assert parse_override("a.b.c=[1, 2]") == (["a", "b", "c"], [1, 2])
    assert parse_override("x= 3 ") == (["x"], 3)
    assert parse_override("x=a=b") == (["x"], "a=b")  # only the first '=' splits
    assert parse_override("x=") == (["x"], None)


# -- errors name the key and the value ----------------------------------------------------


def test_unknown_key_is_named():
    msg = _error(["train.lrr=1"])
    assert "train.lrr" in msg
    assert "got 1" in msg


def test_old_decode_batch_name_is_read_with_a_warning_and_both_refused():
    # rollout.generation_batch_size (before 0.3) is rollout.decode_batch_size: TRL's
    # generation_batch_size means completions per step, so the old name misled TRL users
    with pytest.warns(UserWarning, match="decode_batch_size"):
        cfg = load_config(None, ["rollout.generation_batch_size=7"])
    assert cfg.rollout.decode_batch_size == 7
    assert "generation_batch_size" not in config_to_yaml(cfg)
    msg = _error(["rollout.generation_batch_size=7", "rollout.decode_batch_size=8"])
    assert "decode_batch_size" in msg and "old name" in msg


def test_unknown_section_is_named():
    msg = _error(["trian.lr=1"])
    assert "trian" in msg


def test_wrong_type_names_key_and_value():
    msg = _error(["train.lr=abc"])
    assert "train.lr" in msg
    assert "'abc'" in msg


def test_out_of_range_names_key_and_value():
    msg = _error(["rollout.num_generations=0"])
    assert "rollout.num_generations" in msg
    assert "got 0" in msg
    assert "greater than or equal to 1" in msg


def test_bad_literal_names_key_and_value():
    msg = _error(["algorithm.loss_type=ppo"])
    assert "algorithm.loss_type" in msg
    assert "'ppo'" in msg


@pytest.mark.parametrize("text", ["train.lr", "train.lr 0.1"])
def test_override_without_equals(text: str):
    msg = _error([text])
    assert repr(text) in msg
    assert "key=value" in msg


@pytest.mark.parametrize("text", ["=3", "train..lr=3", "train.=3"])
def test_override_with_empty_key(text: str):
    assert "empty key" in _error([text])


def test_override_with_invalid_yaml_value():
    msg = _error(["train.lr=[1,"])
    assert "train.lr" in msg
    assert "not valid YAML" in msg


def test_override_into_a_value_from_yaml(tmp_path: Path):
    path = tmp_path / "c.yaml"
    path.write_text("train: {lr: 0.1}\n")
    msg = _error(["train.lr.x=1"], path)
    assert "train.lr" in msg
    assert "is a value, not a section" in msg


def test_override_into_a_value_set_by_an_earlier_override():
    msg = _error(["train.lr=0.1", "train.lr.x=1"])
    assert "train.lr is a value, not a section" in msg


def test_override_into_a_default_value():
    # train.lr is only a default here (not in the dict yet): validation still names it
    msg = _error(["train.lr.x=1"])
    assert "train.lr" in msg


def test_missing_file(tmp_path: Path):
    missing = tmp_path / "nope.yaml"
    msg = _error([], missing)
    assert "not found" in msg
    assert str(missing) in msg


def test_non_mapping_yaml(tmp_path: Path):
    path = tmp_path / "list.yaml"
    path.write_text("- a\n- b\n")
    msg = _error([], path)
    assert "mapping" in msg
    assert str(path) in msg


def test_invalid_yaml_file(tmp_path: Path):
    path = tmp_path / "broken.yaml"
    path.write_text("train: [1, 2\n")
    assert "not valid YAML" in _error([], path)


def test_replay_buffer_needs_capacity():
    msg = _error(["method.name=replay"])
    assert "buffer.capacity" in msg
    assert "replay" in msg
    cfg = load_config(None, ["method.name=replay", "buffer.capacity=256"])  # >= B = 128
    assert cfg.buffer.capacity == 256


def test_mini_batch_larger_than_batch():
    # default B = R = 16 * 8 = 128
    msg = _error(["train.mini_batch_size=200"])
    assert "train.mini_batch_size=200" in msg
    assert "B=128" in msg
    msg = _error(["train.batch_size=8", "train.mini_batch_size=16"])
    assert "train.mini_batch_size=16" in msg
    assert "B=8" in msg
    cfg = load_config(None, ["train.batch_size=8", "train.mini_batch_size=8"])
    assert cfg.batch_size == 8
    assert cfg.train.mini_batch_size == 8


def test_empty_rewards_rejected():
    assert "rewards" in _error(["rewards=[]"])


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)


# -- the CLI --------------------------------------------------------------------------------


def test_cli_config_show_prints_resolved_yaml(capsys: pytest.CaptureFixture[str]):
    assert main(["config", "show", "train.lr=0.5", "rollout.num_generations=3"]) == 0
    out = capsys.readouterr().out
    assert "lr: 0.5" in out
    shown = yaml.safe_load(out)
    assert shown["train"]["lr"] == 0.5
    assert shown["rollout"]["num_generations"] == 3
    assert build_config(shown) == load_config(None, ["train.lr=0.5", "rollout.num_generations=3"])


def test_cli_config_show_with_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    path = tmp_path / "c.yaml"
    path.write_text("train: {steps: 9}\n")
    assert main(["config", "show", "--config", str(path), "train.lr=0.25"]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)
    assert shown["train"]["steps"] == 9
    assert shown["train"]["lr"] == 0.25


@pytest.mark.parametrize(
    ("override", "needle"),
    [("train.lrr=1", "train.lrr"), ("train.lr", "train.lr"), ("train.lr=abc", "train.lr")],
)
def test_cli_bad_override_exits_2(capsys: pytest.CaptureFixture[str], override, needle):
    assert main(["config", "show", override]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("error:")
    assert needle in captured.err


def test_cli_missing_config_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    assert main(["config", "show", "--config", str(tmp_path / "missing.yaml")]) == 2
    assert "not found" in capsys.readouterr().err


def test_cli_resume_with_config_is_rejected(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    assert main(["train", "--resume", str(tmp_path), "--config", "x.yaml"]) == 2
    assert "--resume" in capsys.readouterr().err


def test_cli_resume_of_a_non_run_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    assert main(["train", "--resume", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "not a run folder" in err
    assert str(tmp_path) in err
