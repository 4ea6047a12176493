"""CartPole with the velocities hidden: a task that needs a policy with memory.

gymnasium's CartPole-v1 (500 steps at most, reward 1 a step) observing only the cart
position and the pole angle (columns 0 and 2 of the full state): the cart and pole velocities
have to be inferred from consecutive observations. A feed-forward policy sees one frame and
balances poorly; a recurrent one can learn it (rl-baselines3-zoo's PPO-LSTM reaches 500 on
the same task, CartPoleNoVel-v1, within 100,000 steps).

Registered on import as ``ID``; gymnasium imports the module named before a colon in an id,
so ``gym.make("tests.tasks.cartpole_novel:CartPoleNoVel-v1")`` works in any process that can
import ``tests`` (the daemon's ``env.id``, a benchmark's clients).
"""
from __future__ import annotations

import gymnasium as gym
import numpy as np

NAME = "CartPoleNoVel-v1"
ID = f"tests.tasks.cartpole_novel:{NAME}"
VISIBLE = (0, 2)  # cart position, pole angle
OBSERVATION_SPACE_TOML = '{ type = "Box", shape = [2], low = -5.0, high = 5.0 }'
ACTION_SPACE_TOML = '{ type = "Discrete", n = 2 }'


class HideVelocities(gym.ObservationWrapper):
    """Keeps the observation columns ``VISIBLE`` of CartPole's [x, x_dot, theta, theta_dot]."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        full = env.observation_space
        assert isinstance(full, gym.spaces.Box)
        cols = list(VISIBLE)
        self.observation_space = gym.spaces.Box(full.low[cols], full.high[cols], dtype=np.float32)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return np.asarray(observation, np.float32)[list(VISIBLE)]


def make(**kwargs) -> gym.Env:
    return HideVelocities(gym.make("CartPole-v1", **kwargs))


if NAME not in gym.registry:
    gym.register(NAME, entry_point=make, max_episode_steps=None)
