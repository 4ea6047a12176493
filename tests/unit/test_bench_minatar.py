"""The MinAtar scenario's pure parts: its gymnasium id and the learning-curve windows."""
from __future__ import annotations

import pytest

from bench.scenarios import minatar


def test_learning_curve_averages_complete_episodes_per_step_window():
    episodes = [(1.0, 2.0, 10_000), (2.0, 4.0, 49_999), (3.0, 8.0, 60_000), (9.0, 1.0, 170_000)]
    curve = minatar.learning_curve(episodes, 50_000)
    assert curve == [
        {"env_steps": 49_999, "wall_s": 2.0, "return_mean": 3.0, "episodes": 2},
        {"env_steps": 60_000, "wall_s": 3.0, "return_mean": 8.0, "episodes": 1},
        {"env_steps": 170_000, "wall_s": 9.0, "return_mean": 1.0, "episodes": 1},  # empty window left out
    ]


def test_the_daemon_and_clients_make_minatar_through_the_registering_module():
    gym = pytest.importorskip("gymnasium")
    pytest.importorskip("minatar")
    env = gym.make(minatar.env_id("Breakout"))
    try:
        assert env.observation_space.shape == (10, 10, 4) and env.observation_space.dtype == bool
    finally:
        env.close()
    assert f"env.id={minatar.env_id('Breakout')}" in minatar.overrides("Breakout")


def test_running_means_average_the_last_episodes():
    points = minatar.running_means([(1.0, 1.0, 10), (2.0, 3.0, 20), (3.0, 8.0, 30)], last=2)
    assert points == [(1.0, 10, 1.0), (2.0, 20, 2.0), (3.0, 30, 5.5)]


def test_ids_name_the_registering_module():
    pytest.importorskip("minatar")
    from bench.harness import minatar_env
    assert minatar.env_id("Breakout").startswith(minatar_env.PREFIX)
