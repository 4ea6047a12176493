"""bench/scenarios/native_ab.py's arithmetic: the arms of a part's A/B, the gain against the
spread of the same measurement, and when a part earns its place."""
from __future__ import annotations

import pytest

from bench.scenarios.native_ab import PARTS, arms, compare, part_verdict
from rlinkd.daemon.config import NATIVE_PARTS, load_config


@pytest.mark.parametrize("part", NATIVE_PARTS)
def test_the_arms_differ_by_the_part_alone_and_are_valid_configs(part):
    on, off = arms(part)
    assert set(on) - set(off) == {part} and set(off) <= set(on)
    for parts in (on, off):
        assert load_config(None, [("inference", "native_parts", list(parts))]).inference.native_parts == parts
    assert set(PARTS) == set(NATIVE_PARTS)


def test_a_gain_counts_only_beyond_the_spread_of_the_same_measurement():
    # actions/s: on 110 (105-112), off 100 (98-103): every on run beats every off run
    assert compare([105, 110, 112], [98, 100, 103], higher_better=True)["verdict"] == "gain"
    # the same gain in noisier runs: the ranges overlap
    noisy = compare([90, 110, 120], [80, 100, 110], higher_better=True)
    assert noisy["verdict"] == "noise" and noisy["gain"] == pytest.approx(0.1)
    # one outlier widens a range but does not hide a separation
    assert compare([44, 46, 58, 44, 55], [35, 39, 33, 41, 40], higher_better=True)["verdict"] == "gain"
    # latency: less is better, so a larger on arm is a loss
    assert compare([120, 121, 122], [100, 101, 102], higher_better=False)["verdict"] == "loss"
    assert compare([100], [120], higher_better=False)["verdict"] == "n/a"


def test_a_part_earns_its_place_with_a_gain_and_no_loss():
    c = lambda v: {"verdict": v}  # noqa: E731
    assert part_verdict({"a": c("gain"), "b": c("noise")}) is True
    assert part_verdict({"a": c("noise"), "b": c("noise")}) is False
    assert part_verdict({"a": c("gain"), "b": c("loss")}) is False
    assert part_verdict({"a": c("gain"), "b": c("n/a")}) is None
