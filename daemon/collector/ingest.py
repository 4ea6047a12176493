"""Episode fragments → validated step records (pure; no sockets, no processes).

Called by the collector once per received fragment. A fragment of T steps becomes
T step records plus one FINAL_OBS record holding the fragment's last observation
(the bootstrap observation, flagged TERMINATED/TRUNCATED when the episode ended
there), so TCP and shared-memory clients feed the connector one record format
(``shm.records``). Everything is vectorised: one numpy pass per column.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from rlinkd.client_lib.protocol.codec import BadMessage, EpisodeFragment
from rlinkd.client_lib.protocol.spaces import SpaceSpec, check_values


F32_MAX = float(np.finfo(np.float32).max)


class InvalidEpisode(BadMessage):
    """A fragment is well-formed JSON but does not fit the declared spaces or limits."""


@dataclass(frozen=True)
class Limits:
    max_episode_steps: int
    max_obs_floats: int


def _shape_time_major(values: np.ndarray, space: SpaceSpec) -> np.ndarray:
    """Accept [T] for single-element Box spaces (and an empty [0] list for any Box);
    Discrete values stay [T]."""
    if not space.is_discrete and values.ndim == 1 and (space.flat_size == 1 or not values.size):
        return values.reshape(len(values), *space.shape)
    return values


def validate_fragment(frag: EpisodeFragment, obs_space: SpaceSpec, act_space: SpaceSpec,
                      dist_size: int, limits: Limits, where: str) -> EpisodeFragment:
    """Check a fragment against spaces and limits; returns it with normalised shapes.

    Raises InvalidEpisode (an ERROR reply for that client only).
    """
    if frag.num_steps > limits.max_episode_steps:
        raise InvalidEpisode(f"{where}: {frag.num_steps} steps exceed max_episode_steps="
                             f"{limits.max_episode_steps}")
    if obs_space.flat_size > limits.max_obs_floats:
        raise InvalidEpisode(f"{where}: observations exceed max_obs_floats")
    obs = _shape_time_major(frag.obs, obs_space)
    actions = _shape_time_major(frag.actions, act_space)
    errors = (check_values(obs, obs_space, f"{where}.obs"),
              check_values(actions, act_space, f"{where}.actions"),
              _check_finite(obs, f"{where}.obs"),  # unbounded Box dims: float32 range
              _check_finite(actions, f"{where}.actions"),
              _check_finite(frag.rewards, f"{where}.rewards"),
              _check_optional(frag.action_logp, (frag.num_steps,), f"{where}.action_logp"),
              _check_optional(frag.action_dist_inputs, (frag.num_steps, dist_size),
                              f"{where}.action_dist_inputs"))
    error = next((e for e in errors if e), None)
    if error:
        raise InvalidEpisode(error)
    return EpisodeFragment(obs, actions, frag.rewards, frag.is_terminated, frag.is_truncated,
                           frag.action_logp, frag.action_dist_inputs)


def _check_finite(values: np.ndarray, what: str) -> str | None:
    """Finite, and finite as float32: step records are float32 (1e308 would become inf)."""
    if values.size and not np.all(np.isfinite(values)):
        return f"{what}: contains NaN or Inf"
    if values.size and np.abs(values).max() > F32_MAX:
        return f"{what}: values beyond the float32 range"
    return None


def _check_optional(values: np.ndarray | None, shape: tuple[int, ...], what: str) -> str | None:
    if values is None:
        return None
    if values.shape != shape:
        return f"{what}: expected shape {list(shape)}, got {list(values.shape)}"
    return _check_finite(values, what)


@dataclass
class EpisodeTracker:
    """Per-connection episode statistics across fragments (RLlink continuation).

    ``add`` returns the (return, length) of every episode the fragment completes.
    A fragment continues the previous one when that one was cut (neither terminated
    nor truncated) and its first observation repeats the previous last observation.
    """

    open_return: float = 0.0
    open_length: int = 0
    last_obs: np.ndarray | None = None

    def add(self, frag: EpisodeFragment) -> list[tuple[float, int]]:
        continues = self.last_obs is not None and np.array_equal(frag.obs[0], self.last_obs)
        if not continues:
            self.open_return, self.open_length = 0.0, 0
        self.open_return += float(frag.rewards.sum())
        self.open_length += frag.num_steps
        if frag.is_terminated or frag.is_truncated:
            done = [(self.open_return, self.open_length)]
            self.open_return, self.open_length, self.last_obs = 0.0, 0, None
            return done
        self.last_obs = frag.obs[-1].copy()
        return []


@dataclass
class EpisodeStats:
    """Counters of completed episodes, for status (last 100 and last 20 returns)."""

    episodes: int = 0
    returns: deque = field(default_factory=lambda: deque(maxlen=100))
    lengths: deque = field(default_factory=lambda: deque(maxlen=100))

    def record(self, episode_return: float, length: int) -> None:
        self.episodes += 1
        self.returns.append(episode_return)
        self.lengths.append(length)

    def mean_return(self, last: int = 100) -> float | None:
        values = list(self.returns)[-last:]
        return float(np.mean(values)) if values else None

    def mean_length(self) -> float | None:
        return float(np.mean(self.lengths)) if self.lengths else None
