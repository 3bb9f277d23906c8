"""Holm's step-down over the methods of one table: hand-computed levels and claims."""

from __future__ import annotations

import numpy as np
import pytest

from replayrl.bench.claims import ALPHA, holm, holm_claims
from replayrl.bench.intervals import LEVEL, claim, ends


def test_holm_tests_in_order_of_p_and_stops_at_the_first_failure() -> None:
    p = {"a": 0.01, "b": 0.02, "c": 0.03}
    # c would pass at 0.05 but the order reaches b first, at 0.05 / 2, and b fails there
    passes = {"a": lambda lv: lv >= 0.05 / 3, "b": lambda lv: lv >= 0.05, "c": lambda lv: True}
    assert holm(p, passes, 0.05) == {"a": 0.05 / 3, "b": None, "c": None}
    # every one passing: levels alpha / 3, alpha / 2, alpha
    everyone = dict.fromkeys(p, lambda lv: True)
    assert holm(p, everyone, 0.05) == {"a": 0.05 / 3, "b": 0.025, "c": 0.05}
    # ties in p are broken by name, not by the order of the dict
    assert holm({"z": 0.0, "y": 0.0}, {"z": lambda lv: lv > 0.03, "y": lambda lv: True}) == {
        "y": ALPHA / 2,
        "z": ALPHA,
    }


def _dist(center: float, spread: float, n: int = 4000) -> np.ndarray:
    # evenly spaced quantiles: the ends at any level are known
    return np.linspace(center - spread, center + spread, n)


def test_one_method_is_the_unadjusted_rule() -> None:
    ratio, diff = (0.8, _dist(0.8, 0.1)), (0.01, _dist(0.01, 0.02))
    held = holm_claims({"m": ratio}, {"m": diff})
    lo, hi = ends(ratio[1], LEVEL)
    dlo, dhi = ends(diff[1], LEVEL)
    expected = claim({"estimate": 0.8, "low": lo, "high": hi}, {"low": dlo, "high": dhi})
    assert held["m"]["claim"] == expected == "1.1x fewer rollouts; no loss"
    assert held["m"]["family"] == 1 and held["m"]["saving_level"] == pytest.approx(ALPHA)


def test_a_saving_that_clears_alone_is_not_resolved_beside_six_others() -> None:
    # resamples even over [0.685, 0.915]: the upper end at 5% one-sided is 0.9035 (clears
    # 1/1.1 = 0.909), at 5% / 7 it is 0.9134 (does not): tested first of seven (its p is the
    # smallest), it fails, and Holm stops
    near = (0.8, _dist(0.8, 0.115))
    alone = holm_claims({"m": near}, {"m": (0.0, _dist(0.0, 0.01))})
    assert alone["m"]["claim"].startswith("1.1x fewer rollouts")
    others = {f"o{i}": (1.0, _dist(1.0, 0.3)) for i in range(6)}
    diffs = {n: (0.0, _dist(0.0, 0.01)) for n in ["m", *others]}
    family = holm_claims({"m": near, **others}, diffs)
    assert family["m"]["claim"] == "saving not resolved; no loss"
    assert family["m"]["family"] == 7
    # a clear saving is claimed, its k read at the level it passed (alpha / 7 first)
    clear = (0.4, _dist(0.4, 0.1))
    family = holm_claims({"m": clear, **others}, diffs)
    hi = float(np.quantile(clear[1], 1 - ALPHA / 7, method="inverted_cdf"))
    assert family["m"]["saving_level"] == pytest.approx(ALPHA / 7)
    assert family["m"]["claim"].startswith(f"{int(10 / hi) / 10:g}x fewer rollouts")


def test_harm_and_missing_intervals() -> None:
    held = holm_claims(
        {"slow": (1.5, _dist(1.5, 0.2)), "one": (0.5, None), "none": None},
        {
            "slow": (-0.1, _dist(-0.1, 0.05)),
            "one": (0.0, None),
            "none": (0.0, _dist(0.0, 0.001)),
        },
    )
    assert held["slow"]["claim"] == "more rollouts; lower final"
    assert held["one"]["claim"] == "saving not resolved; loss not resolved"
    assert held["none"]["claim"] == "no loss"  # no target reached: a final claim only
