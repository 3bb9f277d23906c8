"""A method is one `method:` block; configs of the layout before it still load.

Before `method`, a method was spread over `buffer.kind`, the `remix` section with its
`enabled` switch and `groups.source` with the sources' sections under `groups`. Run folders
(config.yaml, checkpoints' records), presets and overrides written so are read into `method`
(config/method_sections.py); what cannot be read says how to convert it. The files under
tests/data/old_configs are config.yaml files that the code before `method` wrote."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import yaml

from replayrl.api.config import ReplayConfig
from replayrl.config.schema import ConfigError, build_config, config_to_yaml, load_config
from replayrl.run.records.folder import check_resume_config

OLD = Path(__file__).parent / "data" / "old_configs"


def _old(name: str) -> dict:
    return yaml.safe_load((OLD / f"{name}.yaml").read_text())


@pytest.mark.parametrize(
    ("name", "method", "preset"),
    [
        ("remix-grpo", "remix", "remix-grpo"),
        ("exgrpo", "exgrpo", "exgrpo"),
        ("replay", "replay", "replay"),
    ],
)
def test_an_old_run_folders_config_reads_as_its_method(name: str, method: str, preset: str) -> None:
    data = _old(name)
    with pytest.warns(FutureWarning, match=f"method.name={method}"):
        cfg = build_config(data)
    assert cfg.method.name == method
    assert "remix" not in cfg.model_dump() and "groups" not in cfg.model_dump()
    assert "kind" not in cfg.model_dump()["buffer"]
    # the method's own settings come along: the old record's values, not the defaults
    old_section = data["remix"] if method == "remix" else data["groups"].get(method, {})
    own = cfg.method.settings
    if own is not None:
        got = own.model_dump(mode="json")
        assert {k: v for k, v in old_section.items() if k != "enabled"} == got
    # written back, it is the new layout and reads back unchanged, without a warning
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        assert build_config(yaml.safe_load(config_to_yaml(cfg))) == cfg


def test_the_old_remix_record_is_the_remix_preset_shortened() -> None:
    """The old run folder of remix-grpo (12 steps, T = 6, the KL schedule from step 2) is
    today's preset with the same overrides: one `method:` block holds what four switches
    held."""
    with pytest.warns(FutureWarning):
        old = build_config(_old("remix-grpo"))
    rm = old.method.remix
    assert (rm.off_policy_fraction, rm.num_policies, rm.utd, rm.reincarnation_step) == (
        0.4,
        2,
        2,
        6,
    )
    assert old.algorithm.loss_type == "mix_ppg" and old.kl.target == "convex"
    schedule = ["kl.schedule.start=2", "kl.schedule.every=2"]
    new = load_config("remix-grpo", ["method.remix.reincarnation_step=6", *schedule])
    for section in ("method", "algorithm", "kl", "rollout", "buffer"):
        assert getattr(new, section) == getattr(old, section), section


@pytest.mark.parametrize(
    ("overrides", "method"),
    [
        (["remix.enabled=true", "algorithm.loss_type=mix_ppg", "remix.utd=3"], "remix"),
        (["groups.source=ar3po", "groups.ar3po.reuse=0"], "ar3po"),
        (["buffer.kind=replay", "buffer.capacity=256"], "replay"),
    ],
)
def test_old_overrides_select_the_method_with_a_warning_naming_the_new_keys(
    overrides: list[str], method: str
) -> None:
    with pytest.warns(FutureWarning, match=rf"method.name={method}: the keys"):
        cfg = load_config("grpo", overrides)
    assert cfg.method.name == method
    if method == "remix":
        assert cfg.method.remix.utd == 3
    if method == "ar3po":
        assert cfg.method.ar3po.reuse == 0


def test_old_switches_off_return_to_on_policy_and_leave_other_methods_alone() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # nothing selected: nothing to say
        assert load_config("remix-grpo", ["remix.enabled=false"]).method.name == "onpolicy"
        assert load_config("dapo", ["groups.source=none"]).method.name == "onpolicy"
        assert (
            load_config(
                "replay",
                [
                    "buffer.kind=onpolicy",
                    "buffer.staleness_horizon=null",
                    "buffer.replay_ratio=null",
                ],
            ).method.name
            == "onpolicy"
        )
        assert load_config("exgrpo", ["buffer.kind=onpolicy"]).method.name == "exgrpo"


def test_old_keys_that_cannot_be_read_say_how_to_convert() -> None:
    # one old file selecting two methods (overrides are read one at a time: the later wins)
    with pytest.raises(ConfigError, match=r"select two methods.*set method.name to one of"):
        build_config({"remix": {"enabled": True}, "groups": {"source": "ar3po"}})
    with pytest.raises(ConfigError, match=r"buffer.kind=lifo.*method.name=onpolicy"):
        load_config("grpo", ["buffer.kind=lifo"])


def test_an_old_checkpoint_record_is_compared_in_todays_layout() -> None:
    """check_resume_config reads the checkpoint's own record: an old one holds `remix.*` and
    `groups.*`; ReMix's window size is still frozen, under its new key."""
    with pytest.warns(FutureWarning):
        saved = build_config(_old("remix-grpo"))

    class OldRecord:  # the record as the old code wrote it (config.yaml's mapping)
        def model_dump(self, mode: str = "json") -> dict:
            return _old("remix-grpo")

    same = load_config("remix-grpo", ["method.remix.reincarnation_step=6"])
    check_resume_config(OldRecord(), same)  # type: ignore[arg-type]
    check_resume_config(saved, same)
    wider = load_config("remix-grpo", ["method.remix.num_policies=3"])
    with pytest.raises(ConfigError, match=r"method.remix.num_policies \(the checkpoint has 2"):
        check_resume_config(OldRecord(), wider)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"method.name \(the checkpoint has 'remix'"):
        check_resume_config(OldRecord(), load_config("grpo"))  # type: ignore[arg-type]


def test_the_python_api_reads_old_and_new_method_keys() -> None:
    new = ReplayConfig("remix-grpo", method__remix__utd=3, train__steps=3)
    assert new.to_config().method.remix.utd == 3 and new.num_iterations == 3
    with pytest.warns(FutureWarning):
        old = ReplayConfig(
            "grpo", remix__enabled=True, algorithm__loss_type="mix_ppg", remix__utd=3
        ).to_config()
    assert old.method.name == "remix" and old.method.remix.utd == 3
    # TRL's num_iterations sets the method's own passes key (ReMix's m), not train.epochs
    passes = ReplayConfig("remix-grpo", num_iterations=4).to_config()
    assert passes.method.remix.utd == 4 and passes.train.epochs == 1
    replay = ReplayConfig("replay", replay_ratio=2, staleness_horizon=4)
    cfg = replay.to_config()
    assert cfg.method_spec.buffer == "replay" and cfg.buffer.capacity == 4 * cfg.rollouts_per_step
    with pytest.raises(ConfigError, match="method__name='replay'"):
        ReplayConfig("grpo", replay_ratio=2).to_config()


def test_a_methods_loss_is_its_entrys_and_another_is_refused_or_warned() -> None:
    # one block selects ReMix: its loss comes with it where the config names none
    assert build_config({"method": {"name": "remix"}}).algorithm.loss_type == "mix_ppg"
    with pytest.raises(
        ConfigError, match="method.name=remix is built for algorithm.loss_type=mix_ppg"
    ):
        load_config("grpo", ["method.name=remix"])  # the grpo preset names grpo_clip
    with pytest.warns(
        UserWarning, match="method.name=repo is built for algorithm.loss_type=grpo_clip"
    ):
        load_config("repo", ["algorithm.loss_type=asymre"])
    with pytest.raises(ConfigError, match="method.name=ar3po needs algorithm.advantage=grpo"):
        load_config("ar3po", ["algorithm.advantage=rloo"])


def test_the_later_layer_wins_in_either_layout(tmp_path: Path) -> None:
    """An old file under a new override (a resumed old run folder), and a new preset under an
    old override: each layer is read into `method` before it is merged."""
    old_file = tmp_path / "config.yaml"
    old_file.write_text((OLD / "remix-grpo.yaml").read_text())
    with pytest.warns(FutureWarning):
        resumed = load_config(str(old_file), ["method.remix.utd=3"])
    assert resumed.method.name == "remix" and resumed.method.remix.utd == 3
    with pytest.warns(FutureWarning):
        old_over_new = load_config("remix-grpo", ["remix.utd=4", "remix.enabled=true"])
    assert old_over_new.method.remix.utd == 4
    # a new method block in a file of one's own brings its loss (the file names none)
    mine = tmp_path / "mine.yaml"
    mine.write_text("method: {name: remix, remix: {utd: 3}}\n")
    cfg = load_config(str(mine))
    assert cfg.algorithm.loss_type == "mix_ppg" and cfg.method.remix.utd == 3
