"""MinAtar's gymnasium environments, registered on import.

The ``minatar`` package (``pip install minatar``, in the ``bench`` extra) defines its
gymnasium ids ("MinAtar/Breakout-v1", ...) but registers them only when
``minatar.gym.register_envs()`` is called. gymnasium imports the module named before a
colon in an id, so ``gym.make("bench.harness.minatar_env:MinAtar/Breakout-v1")`` works in
any process that can import ``bench`` (the daemon's ``env.id``, the benchmark's clients).
Observations are bool Box [10, 10, C]; v1 ids use the game's minimal action set.
"""
from __future__ import annotations

import gymnasium as gym

PREFIX = f"{__name__}:"
"""Prefix of a MinAtar id that makes gymnasium import (and so register) this module
(``bench.scenarios.minatar.env_id`` builds ids with it without importing this module)."""


def register() -> None:
    """Register every MinAtar id once (idempotent: gymnasium warns on re-registration)."""
    if "MinAtar/Breakout-v1" not in gym.registry:
        from minatar.gym import register_envs
        register_envs()


register()
