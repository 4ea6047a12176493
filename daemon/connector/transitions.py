"""Segments → n-step replay transitions (the off-policy connector's pure core; numpy only).

One row per step ``t`` of a segment of ``T`` steps, for ``shm.replay``::

    m_t        = min(n, T - t)                        steps to the horizon or the segment's end
    reward_t   = r_t + g r_t+1 + ... + g^(m_t - 1) r_t+m_t-1
    discount_t = 0 if the segment terminated and t + m_t = T, else g^m_t
    next_obs_t = obs[t + m_t]                          (obs[T]: the segment's final observation)

so a learner's target is ``reward_t + discount_t * V(next_obs_t)``. A segment that was cut
(between RLlink fragments) or truncated bootstraps from its final observation with the
shorter horizon: no state is kept across segments.
"""
from __future__ import annotations

import numpy as np

from rlinkd.daemon.connector.segments import Segment
from rlinkd.shm.replay import ReplayLayout


def nstep_returns(rewards: np.ndarray, terminated: bool, n: int, gamma: float
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(reward_t [T], discount_t [T], m_t [T]) as in the module docstring."""
    rewards = np.asarray(rewards, np.float64)                      # [T]
    steps = len(rewards)
    t = np.arange(steps)
    horizon = np.minimum(n, steps - t)                            # m_t [T]
    returns = np.zeros(steps)
    for k in range(min(n, steps)):          # sum over k < m_t of g^k r_t+k (t + k < T <=> k < m_t)
        returns[:steps - k] += gamma ** k * rewards[k:]
    discount = gamma ** horizon.astype(np.float64)
    if terminated:
        discount[t + horizon == steps] = 0.0                      # the window reaches the end
    return returns.astype(np.float32), discount.astype(np.float32), horizon


def transitions(seg: Segment, n: int, gamma: float, out: np.ndarray) -> None:
    """The replay rows of one segment into ``out`` (``layout.dtype``, one row per step)."""
    returns, discount, horizon = nstep_returns(seg.rewards, seg.terminated, n, gamma)
    steps = seg.num_steps
    out["reward"], out["discount"], out["seq_no"] = returns, discount, seg.behaviour_seq_no
    out["action"] = seg.actions.reshape(steps, -1)
    out["obs"] = seg.obs[:steps]
    out["next_obs"] = seg.obs[np.arange(steps) + horizon]


def segments_to_rows(segments: list[Segment], n: int, gamma: float, layout: ReplayLayout) -> np.ndarray:
    """Every segment's rows, in order, in one array of ``layout.dtype``."""
    rows = layout.empty(sum(s.num_steps for s in segments))
    start = 0
    for seg in segments:
        if seg.num_steps:
            transitions(seg, n, gamma, rows[start:start + seg.num_steps])
            start += seg.num_steps
    return rows
