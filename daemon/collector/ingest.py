"""Episode fragments → validated step records (pure; no sockets, no processes).

Called by the collector once per received fragment. A fragment of T steps becomes
T step records plus one FINAL_OBS record holding the fragment's last observation
(the bootstrap observation, flagged TERMINATED/TRUNCATED when the episode ended
there), so TCP and shared-memory clients feed the connector one record format
(``shm.records``). Everything is vectorised: one numpy pass per column.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field, replace

import numpy as np

from rlinkd.client_lib.protocol.codec import BadMessage, EpisodeFragment
from rlinkd.client_lib.protocol.columns import Columns
from rlinkd.client_lib.protocol.fragments import Fragment, from_wire
from rlinkd.client_lib.protocol.masking import MaskSpec, check_actions, check_masks
from rlinkd.client_lib.protocol.recurrent import check_state, state_rows
from rlinkd.client_lib.protocol.spaces import InvalidValue, Space
from rlinkd.client_lib.protocol.wire import F32_MAX
from rlinkd.shm.records import StepLayout


class InvalidEpisode(BadMessage):
    """A fragment is well-formed JSON but does not fit the declared spaces or limits."""


@dataclass(frozen=True)
class Limits:
    max_episode_steps: int
    max_obs_floats: int


@dataclass(frozen=True)
class Spaces:
    """What a fragment is validated against (made once per collector)."""

    obs: Space
    act: Space
    dist_size: int
    mask: MaskSpec | None = None
    state_size: int = 0       # S of a recurrent policy's state (0: feed-forward)
    max_seq_len: int = 0      # L, the fragment state grid of a recurrent policy

    @property
    def obs_elements(self) -> int:
        """Numbers in one observation (all leaves)."""
        return sum(math.prod(leaf.space.record_shape) for leaf in self.obs.leaves())


@dataclass(frozen=True)
class PolicyInfo:
    """What the collector knows of one policy: what its episodes are checked against, their
    record layout, and whether they are trained (a frozen policy's episodes are only counted)."""

    spaces: Spaces
    layout: StepLayout
    trainable: bool = True
    off_policy: bool = False  # DQN, SAC, APPO: its clients never wait for training
    box_dist: str = "gaussian"  # SAC: "squashed_gaussian" (announced in SET_CONFIG)
    state: dict | None = None  # recurrent: ``recurrent.state_contract`` (SET_CONFIG "state")


def validate_fragment(frag: EpisodeFragment, spaces: Spaces, limits: Limits,
                      where: str) -> Fragment:
    """Convert a received fragment to canonical form, checking it against the spaces (every
    leaf: structure, dtype, shape, bounds, finiteness), the action mask and the limits.

    Raises InvalidEpisode naming the bad leaf (an ERROR reply for that client only).
    """
    if frag.num_steps > limits.max_episode_steps:
        raise InvalidEpisode(f"{where}: {frag.num_steps} steps exceed max_episode_steps="
                             f"{limits.max_episode_steps}")
    if spaces.obs_elements > limits.max_obs_floats:
        raise InvalidEpisode(f"{where}: observations exceed max_obs_floats")
    try:
        canonical = from_wire(frag, spaces.obs, spaces.act, where)
    except InvalidValue as exc:
        raise InvalidEpisode(str(exc)) from None
    error = (_check_finite(frag.rewards, f"{where}.rewards")
             or _check_optional(frag.action_logp, (frag.num_steps,), f"{where}.action_logp")
             or _check_optional(frag.action_dist_inputs, (frag.num_steps, spaces.dist_size),
                                f"{where}.action_dist_inputs")
             or _check_mask(canonical, spaces.mask, where))
    if error:
        raise InvalidEpisode(error)
    return _with_state(canonical, spaces, where)


def _with_state(frag: Fragment, spaces: Spaces, where: str) -> Fragment:
    """The fragment with its ``state_in`` checked against the policy (float32 [K, S], K =
    ``state_rows(T, L)``, finite): required for a recurrent policy, refused for a
    feed-forward one."""
    if not spaces.state_size:
        if frag.state_in is not None:
            raise InvalidEpisode(f"{where}.state_in: the policy is feed-forward (no state)")
        return frag
    if frag.state_in is None:
        raise InvalidEpisode(f"{where}: the policy is recurrent: state_in (the state before "
                             f"steps 0, {spaces.max_seq_len}, ...) is required")
    rows = state_rows(frag.num_steps, spaces.max_seq_len)
    if rows == 0 and np.size(frag.state_in) == 0:  # (a fragment of no steps has no state)
        return replace(frag, state_in=np.zeros((0, spaces.state_size), np.float32))
    try:
        state = check_state(frag.state_in, rows, spaces.state_size)
    except ValueError as exc:
        raise InvalidEpisode(f"{where}.{exc}") from None
    if np.abs(state).max(initial=0.0) > F32_MAX:
        raise InvalidEpisode(f"{where}.state_in: values beyond the float32 range")
    return replace(frag, state_in=state)


def _check_mask(frag: Fragment, mask: MaskSpec | None, where: str) -> str | None:
    """Every step's mask leaves a choice, and no action takes a masked choice."""
    if mask is None:
        return None
    masks = frag.obs[mask.key]                                  # [T+1, m]
    what = f'{where}.obs["{mask.key}"]'
    return (check_masks(masks[:-1], mask, what)
            or check_actions(masks[:-1], frag.actions, mask, f"{where}.actions"))


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
    last_obs: Columns | None = None

    def add(self, frag: Fragment) -> list[tuple[float, int]]:
        continues = self.last_obs is not None and frag.first_obs_equals(self.last_obs, -1)
        if not continues:
            self.open_return, self.open_length = 0.0, 0
        self.open_return += float(frag.rewards.sum())
        self.open_length += frag.num_steps
        if frag.is_terminated or frag.is_truncated:
            done = [(self.open_return, self.open_length)]
            self.open_return, self.open_length, self.last_obs = 0.0, 0, None
            return done
        self.last_obs = {key: col[-1:].copy() for key, col in frag.obs.items()}
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
