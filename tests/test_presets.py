"""Every shipped preset validates and keeps the papers' defaults it promises."""

from pathlib import Path

import pytest

from replayrl.config import load_config

CONFIGS = sorted((Path(__file__).parent.parent / "configs").glob("*.yaml"))


def test_presets_exist() -> None:
    names = {p.stem for p in CONFIGS}
    assert {"demo", "grpo", "replay", "remix-grpo", "remix-ppo", "ppo"} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_preset_validates(path: Path) -> None:
    cfg = load_config(path)
    assert cfg.train.steps > 0 and cfg.rollouts_per_step > 0


@pytest.mark.parametrize("name", ["remix-grpo", "remix-ppo"])
def test_remix_presets_carry_paper_defaults(name: str) -> None:
    cfg = load_config(Path(__file__).parent.parent / "configs" / f"{name}.yaml")
    r = cfg.remix
    assert (r.enabled, r.off_policy_fraction, r.num_policies, r.utd) == (True, 0.4, 2, 2)
    assert r.reincarnation_step == 50
    assert (cfg.kl.beta, cfg.kl.estimator, cfg.kl.target) == (0.001, "k3", "convex")
    assert cfg.algorithm.entropy_coef == 0.001 and cfg.algorithm.epsilon == 0.2
    assert cfg.algorithm.loss_type == "mix_ppg"
    assert (cfg.algorithm.advantage == "gae") == (name == "remix-ppo")
