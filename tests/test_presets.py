"""Every shipped preset validates and keeps the papers' defaults it promises."""

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from replayrl.api.config import ReplayConfig
from replayrl.config.catalog import (
    listing,
    preset_names,
    resolve_preset,
    resolve_suite,
    suite_names,
)
from replayrl.config.schema import ConfigError, load_config

CONFIGS = [resolve_preset(name) for name in preset_names()]


def test_presets_exist() -> None:
    names = {p.stem for p in CONFIGS}
    assert {"demo", "grpo", "replay", "remix-grpo", "remix-ppo", "ppo"} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_preset_validates(path: Path) -> None:
    cfg = load_config(path)
    assert cfg.train.steps > 0 and cfg.rollouts_per_step > 0


@pytest.mark.parametrize("name", ["remix-grpo", "remix-ppo"])
def test_remix_presets_carry_paper_defaults(name: str) -> None:
    cfg = load_config(name)
    r = cfg.method.remix
    assert cfg.method.name == "remix"
    assert (r.off_policy_fraction, r.num_policies, r.utd) == (0.4, 2, 2)
    assert r.reincarnation_step == 50
    assert (cfg.kl.beta, cfg.kl.estimator, cfg.kl.target) == (0.001, "k3", "convex")
    assert cfg.algorithm.entropy_coef == 0.001 and cfg.algorithm.epsilon == 0.2
    assert cfg.algorithm.loss_type == "mix_ppg"
    assert (cfg.algorithm.advantage == "gae") == (name == "remix-ppo")


def test_presets_and_suites_resolve_by_name_from_any_folder(tmp_path: Path) -> None:
    old = Path.cwd()
    os.chdir(tmp_path)  # no configs/ folder here: the names come from the package
    try:
        assert load_config("remix-grpo").method.name == "remix"
        assert load_config("remix-grpo.yaml") == load_config("remix-grpo")
        assert resolve_suite("default").is_file()
        with pytest.raises(ConfigError, match="shipped: .*remix-grpo"):
            load_config("no-such-preset")
        local = tmp_path / "grpo"  # an existing file wins over a shipped name
        local.write_text("train: {steps: 3}\n")
        assert load_config("grpo").train.steps == 3
    finally:
        os.chdir(old)


def test_every_shipped_suite_names_shipped_presets() -> None:
    from replayrl.bench.suite import load_suite, variant_config

    assert {"default", "async"} <= set(suite_names())
    for name in suite_names():
        suite = load_suite(name)
        for variant in suite["variants"]:
            cfg = variant_config(suite, variant, 0, Path("unused"), quick=True)
            assert cfg.train.steps > 0


def test_presets_listing_has_one_line_each() -> None:
    rows = dict(listing())
    assert set(rows) == set(preset_names())
    assert all(desc and "\n" not in desc for desc in rows.values())
    assert rows["demo"].startswith("The built-in demo")


def test_cli_presets_command_from_another_folder(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    out = subprocess.run(
        [sys.executable, "-m", "replayrl", "presets"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    lines = out.splitlines()
    for name in ("demo", "grpo", "remix-grpo", "default"):
        assert any(line.split()[:1] == [name] for line in lines), out


def test_package_data_globs_cover_every_shipped_file() -> None:
    """pyproject's package-data must ship every preset, suite and preset reward file."""
    import fnmatch
    import tomllib

    root = Path(__file__).parents[1]
    pkg = root / "src" / "replayrl"
    globs = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"
    ]["replayrl"]
    shipped = [
        p.relative_to(pkg).as_posix()
        for folder in ("config/presets", "config/suites")
        for p in (pkg / folder).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    ]
    assert shipped
    missing = [f for f in shipped if not any(fnmatch.fnmatch(f, g) for g in globs)]
    assert not missing, f"not in [tool.setuptools.package-data]: {missing}"


# -- x = N/R and y = B/R (paper 1's parameters) ------------------------------------------------
def _no_warning(preset: str | None, overrides: list[str]):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return load_config(preset, overrides)


def test_replay_preset_is_written_in_ratios_and_scales_with_r() -> None:
    cfg = _no_warning("replay", [])  # R = 8 x 8 = 64
    assert (cfg.buffer.staleness_horizon, cfg.buffer.replay_ratio) == (4, 2)
    assert (cfg.buffer.capacity, cfg.batch_size) == (256, 128)
    # a TRL user's 4 rollouts per step: N = 16, B = 8, not 256 and 128
    small = _no_warning("replay", ["rollout.prompts_per_step=1", "rollout.num_generations=4"])
    assert (small.buffer.capacity, small.batch_size) == (16, 8)
    api = ReplayConfig("replay", num_generations=4, generation_batch_size=4).to_config()
    assert (api.buffer.capacity, api.batch_size) == (16, 8)


def test_absolute_n_and_b_still_win_and_warn_when_far_from_the_ratio() -> None:
    # within 2x of the intent (x = 4, y = 2 at R = 64): accepted silently
    near = _no_warning("replay", ["buffer.capacity=128", "train.batch_size=64"])
    assert (near.buffer.capacity, near.batch_size) == (128, 64)
    with pytest.warns(UserWarning, match=r"buffer.capacity=1024 .* 16 = N/R.*staleness_horizon=4"):
        far = load_config("replay", ["buffer.capacity=1024"])
    assert far.buffer.capacity == 1024 and far.batch_size == 128
    with pytest.warns(UserWarning, match=r"train.batch_size=32 .* 0.5 = B/R.*replay_ratio=2"):
        load_config("replay", ["train.batch_size=32"])


def test_rounding_at_a_small_r_warns() -> None:
    # x = 0.2 at R = 2: N = round(0.4) = 0 -> at least 1, i.e. x = 0.5 (2.5x the intent)
    base = ["method.name=replay", "rollout.prompts_per_step=1", "rollout.num_generations=2"]
    with pytest.warns(UserWarning, match="N/R"):
        cfg = load_config(
            None, [*base, "buffer.staleness_horizon=0.2", "buffer.with_replacement=true"]
        )
    assert cfg.buffer.capacity == 1


def test_ratios_need_replay_and_leave_auto_to_the_design() -> None:
    with pytest.raises(ConfigError, match="buffer.replay_ratio needs method.name=replay"):
        load_config(None, ["buffer.replay_ratio=2"])
    with pytest.raises(ConfigError, match="greater than 0"):
        load_config("replay", ["buffer.staleness_horizon=0"])
    cfg = _no_warning("replay", ["buffer.capacity=auto", "train.batch_size=auto"])
    assert cfg.buffer.capacity == "auto" and cfg.train.batch_size == "auto"
