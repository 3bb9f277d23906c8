"""Every shipped preset validates and keeps the papers' defaults it promises."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

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
    r = cfg.remix
    assert (r.enabled, r.off_policy_fraction, r.num_policies, r.utd) == (True, 0.4, 2, 2)
    assert r.reincarnation_step == 50
    assert (cfg.kl.beta, cfg.kl.estimator, cfg.kl.target) == (0.001, "k3", "convex")
    assert cfg.algorithm.entropy_coef == 0.001 and cfg.algorithm.epsilon == 0.2
    assert cfg.algorithm.loss_type == "mix_ppg"
    assert (cfg.algorithm.advantage == "gae") == (name == "remix-ppo")


def test_presets_and_suites_resolve_by_name_from_any_folder(tmp_path: Path) -> None:
    old = Path.cwd()
    os.chdir(tmp_path)  # no configs/ folder here: the names come from the package
    try:
        assert load_config("remix-grpo").remix.enabled
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
