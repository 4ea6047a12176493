"""FindTheSpot: the right action is visible only in the image.

Observation: Dict(image = Box(0, 255, [6, 6, 1], uint8), noise = Box(-1, 1, [2], float32)).
The image is dark but for one bright pixel at a random (row, column); ``noise`` is a
distractor drawn at random each step. Action: MultiDiscrete([3, 2]): which third of the
columns (0..2) and which half of the rows (0..1) holds the spot. Reward: 0.5 per correct
component (1.0 for both). Episodes last ``EPISODE_STEPS`` steps, each with a new spot.

A policy that ignores the image earns 0.5/3 + 0.5/2 ≈ 0.42 a step; one that reads it, 1.0.
"""
from __future__ import annotations

from typing import ClassVar

import gymnasium as gym
import numpy as np

EPISODE_STEPS = 8
SIZE = 6


class FindTheSpot(gym.Env):
    metadata: ClassVar[dict] = {"render_modes": []}

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Dict({
            "image": gym.spaces.Box(0, 255, (SIZE, SIZE, 1), np.uint8),
            "noise": gym.spaces.Box(-1.0, 1.0, (2,), np.float32)})
        self.action_space = gym.spaces.MultiDiscrete([3, 2])
        self._spot = (0, 0)
        self._t = 0

    def _observe(self) -> dict:
        row, col = int(self.np_random.integers(SIZE)), int(self.np_random.integers(SIZE))
        self._spot = (row, col)
        image = np.zeros((SIZE, SIZE, 1), np.uint8)
        image[row, col, 0] = 255
        return {"image": image, "noise": self.np_random.uniform(-1, 1, 2).astype(np.float32)}

    def answer(self) -> np.ndarray:
        row, col = self._spot
        return np.array([col // (SIZE // 3), row // (SIZE // 2)])

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self._t = 0
        return self._observe(), {}

    def step(self, action):
        reward = 0.5 * float(np.sum(np.asarray(action) == self.answer()))
        self._t += 1
        return self._observe(), reward, False, self._t >= EPISODE_STEPS, {}


OBSERVATION_SPACE_TOML = ('{ type = "Dict", spaces = { image = { type = "Box", shape = [6, 6, 1], '
                          'dtype = "uint8", low = 0, high = 255 }, noise = { type = "Box", '
                          'shape = [2], low = -1.0, high = 1.0 } } }')
ACTION_SPACE_TOML = '{ type = "MultiDiscrete", nvec = [3, 2] }'
