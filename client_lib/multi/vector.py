"""``VectorClient``: N copies of one simulator stepped together, array in, array out.

    client = connect_vector("tcp://127.0.0.1:5555", num_envs=64)
    actions = client.act(obs_batch)                 # [64, ...] in, [64] (or a dict) out
    client.step(rewards, next_obs_batch, terminated, truncated)

Copy ``i`` is agent ``f"{agent_prefix}{i}"`` on agent slot ``i`` (its policy from SET_CONFIG's
policy_mapping). Autoreset as gymnasium's same-step mode: ``next_obs_batch[i]`` is copy i's
observation after its action (the final one when the episode ended), and after an ended
episode the next ``act``'s ``obs_batch[i]`` is the new episode's first observation.

Steps are stored as columns ``[T, N, ...]`` (observations ``[T+1, N, ...]``): a step costs a
few array copies whatever N is. Only when ``env_steps_per_sample`` steps (T * N) are
collected are the columns split into per-agent fragments (one per episode piece of each
copy, ended pieces with their final observation, the open piece cut: it continues in the
next send) and sent as one message.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from rlinkd.client_lib.links import Sends
from rlinkd.client_lib.policy import forward
from rlinkd.client_lib.multi.book import (EpisodeIds, PolicyBook, check_agent_id,
                                          check_multi_config)
from rlinkd.client_lib.protocol.columns import Columns, obs_columns
from rlinkd.client_lib.protocol.fragments import Fragment


class VectorClient:
    """``num_envs`` agents acting and stepping in lockstep (``connect_vector`` makes one)."""

    def __init__(self, link, num_envs: int, agent_prefix: str = "env_", explore: bool = True,
                 seed: int | None = None) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        self.link, self.n, self.explore = link, num_envs, explore
        cfg = link.open_policies()
        try:
            limit = check_multi_config(cfg, link.describe())
            if num_envs > limit:
                raise ValueError(f"num_envs={num_envs} exceeds the server's "
                                 f"max_agents_per_connection ({limit})")
            self.agent_ids = [check_agent_id(f"{agent_prefix}{i}") for i in range(num_envs)]
            self.book = PolicyBook(link, cfg, seed)
            self._group()
        except (ValueError, ConnectionError):
            link.close()
            raise
        self.env_steps_per_sample = cfg.env_steps_per_sample
        self.horizon = max(1, math.ceil(cfg.env_steps_per_sample / num_envs))  # T per send
        self.nonce = EpisodeIds().prefix
        self.steps_synced = 0
        self._allocate()

    def _group(self) -> None:
        """Copies by policy (row index arrays); every policy must share the spaces."""
        names = [self.book.name_for(a) for a in self.agent_ids]
        self.policy_names = names
        self.groups = [(self.book.get(name), np.array([i for i, n in enumerate(names) if n == name]))
                       for name in dict.fromkeys(names)]
        first = self.groups[0][0]
        for local, _ in self.groups[1:]:
            if (local.obs_space.to_json(), local.act_space.to_json(), local.state_size,
                    local.max_seq_len) != (first.obs_space.to_json(), first.act_space.to_json(),
                                           first.state_size, first.max_seq_len):
                raise ValueError(f"policies {first.name!r} and {local.name!r} have different "
                                 "spaces or states: one vectorized env cannot act with both")
        self.obs_space, self.act_space = first.obs_space, first.act_space
        self.chooser = first.chooser
        self.state_size, self.max_seq_len = first.state_size, first.max_seq_len

    def _allocate(self) -> None:
        t, n = self.horizon, self.n
        self.obs = {leaf.key: np.zeros((t + 1, n, *leaf.space.record_shape), leaf.space.record_dtype)
                    for leaf in self.obs_space.leaves()}
        self.actions = np.zeros((t, n, self.chooser.dist.action_size), np.float32)
        self.logp = np.zeros((t, n), np.float32)
        self.dist: np.ndarray | None = None  # [t, n, D], D known after the first forward
        self.rewards = np.zeros((t, n), np.float64)
        self.terminated = np.zeros((t, n), bool)
        self.truncated = np.zeros((t, n), bool)
        self.finals: list[tuple[int, np.ndarray, Columns]] = []  # (row, copies, final obs)
        self.fresh = np.ones(n, bool)         # copies whose next act starts an episode
        s = self.state_size                   # recurrent: the state before each step, and now
        self.states = np.zeros((t, n, s), np.float32) if s else None
        self.state = np.zeros((n, s), np.float32) if s else None
        self.episode_base = np.zeros(n, np.int64)  # episode number of row 0's piece
        self.t = 0
        self.pending = False

    @property
    def weights_seq_nos(self) -> dict[str, int]:
        return self.book.held()

    # ------------------------------------------------------------ act / step
    def act(self, obs_batch: Any, explore: bool | None = None) -> Any:
        """Actions for all copies in a VectorEnv's batched form (``ActionChooser.to_env_batch``).
        ValueError if the last act was not stepped; InvalidValue for observations outside
        the space (nothing recorded)."""
        if self.pending:
            raise ValueError("act() again before step(): every act needs its step")
        x = obs_columns(obs_batch, self.obs_space, self.n, "obs", batched=True)
        explore = self.explore if explore is None else explore
        if self.state is not None and self.states is not None:
            self.state[self.fresh] = 0.0          # a copy starting an episode: zeros
            self.states[self.t] = self.state
        self._forward(x, explore)
        t, fresh = self.t, self.fresh
        if fresh.any():
            for key, column in x.items():
                self.obs[key][t][fresh] = column[fresh]
            fresh[:] = False
        self.pending = True
        return self.chooser.to_env_batch(self.actions[t])

    def _forward(self, x: Columns, explore: bool) -> None:
        """One forward and one draw per policy; fills row t of actions/logp/dist."""
        t = self.t
        if len(self.groups) == 1:
            local = self.groups[0][0]
            dist, state_out = forward(local.net, x, self.state)
            self.actions[t], self.logp[t] = local.chooser.choose_batch(dist, explore, _epsilon(local))
            if state_out is not None:
                self.state = state_out
        else:
            parts = []
            for local, rows in self.groups:
                state = None if self.state is None else self.state[rows]
                d, state_out = forward(local.net, {k: v[rows] for k, v in x.items()}, state)
                self.actions[t, rows], self.logp[t, rows] = local.chooser.choose_batch(d, explore, _epsilon(local))
                if self.state is not None and state_out is not None:
                    self.state[rows] = state_out
                parts.append((rows, d))
            dist = np.empty((self.n, parts[0][1].shape[1]), np.float32)
            for rows, d in parts:
                dist[rows] = d
        if self.dist is None:
            self.dist = np.zeros((self.horizon, self.n, dist.shape[1]), np.float32)
        self.dist[t] = dist

    def step(self, rewards, next_obs_batch: Any, terminated=None, truncated=None) -> None:
        """Record the outcome of the last ``act`` for every copy (arrays [N]; None means all
        False). A copy whose episode ended starts a new one at the next ``act``. May send a
        sample and install newer weights. ValueError / InvalidValue: nothing recorded."""
        if not self.pending:
            raise ValueError("step() without act(): call act() first")
        r = self._vector(rewards, np.float64, "rewards")
        term = self._vector(terminated, bool, "terminated")
        trunc = self._vector(truncated, bool, "truncated")
        x = obs_columns(next_obs_batch, self.obs_space, self.n, "next_obs", batched=True)
        t = self.t
        self.rewards[t], self.terminated[t], self.truncated[t] = r, term, trunc
        for key, column in x.items():
            self.obs[key][t + 1] = column
        done = term | trunc
        if done.any():
            copies = np.flatnonzero(done)
            self.finals.append((t, copies, {k: v[copies].copy() for k, v in x.items()}))
            self.fresh |= done
        self.t, self.pending = t + 1, False
        if self.t >= self.horizon:
            self.sync()

    def truncate(self) -> None:
        """End every copy's episode in progress as truncated at its last recorded step (a
        copy whose piece was sent already starts its next episode under a new id): every
        copy's next ``act`` starts an episode. For a driver that resets its env while copies
        are mid-episode. ValueError if an action is pending (step it first)."""
        if self.pending:
            raise ValueError("truncate(): an action is pending (step it first)")
        open_copies = np.flatnonzero(~self.fresh)
        if self.t and open_copies.size:
            row = self.t - 1
            self.truncated[row, open_copies] = True
            self.finals.append((row, open_copies, {k: v[self.t][open_copies].copy()
                                                   for k, v in self.obs.items()}))
        elif open_copies.size:  # (their open pieces went out with the last send)
            self.episode_base[open_copies] += 1
        self.fresh[:] = True

    def _vector(self, value, dtype, what: str) -> np.ndarray:
        if value is None:
            return np.zeros(self.n, dtype)
        arr = np.asarray(value)
        if arr.shape != (self.n,):
            raise ValueError(f"step(): {what} must have shape ({self.n},), got {arr.shape}")
        return arr.astype(dtype, copy=False)

    # ------------------------------------------------------------ send
    def sync(self) -> None:
        """Split the collected columns into per-agent fragments, send them, install the
        weights that come back, and start the next columns from the last observations."""
        sends = self._split()
        if sends:
            self.book.install(self.link.exchange(sends, self.book.held(), get_state=True))
            self.steps_synced += self.t * self.n
        self._restart()

    def _restart(self) -> None:
        t = self.t
        done = self.terminated[:t] | self.truncated[:t]
        self.episode_base += done.sum(axis=0)
        for column in self.obs.values():
            column[0] = column[t]
        self.finals, self.t = [], 0

    def _split(self) -> Sends:
        """Per copy, in time order: each ended piece (final obs from ``finals``), then the
        open piece cut at row t (its last obs is row t's)."""
        t = self.t
        if t == 0:
            return []
        finals = {(row, int(c)): (cols, j) for row, copies, cols in self.finals
                  for j, c in enumerate(copies)}
        copies, rows = np.nonzero((self.terminated[:t] | self.truncated[:t]).T)  # by copy, then row
        bounds = np.searchsorted(copies, np.arange(self.n + 1)).tolist()
        rows_list = rows.tolist()
        sends: Sends = []
        for i in range(self.n):
            start, number = 0, int(self.episode_base[i])
            for row in rows_list[bounds[i]:bounds[i + 1]]:
                cols, j = finals[(row, i)]
                last = {k: v[j:j + 1] for k, v in cols.items()}
                sends.append((i, self._piece(i, start, row + 1, last, number, True)))
                start, number = row + 1, number + 1
            if start < t:
                last = {k: v[t, i][None] for k, v in self.obs.items()}
                sends.append((i, self._piece(i, start, t, last, number, False)))
        return sends

    def _piece(self, i: int, start: int, stop: int, last: Columns, number: int,
               ended: bool) -> Fragment:
        """Copy i's steps [start, stop) as a fragment whose final observation is ``last``.
        Arrays other than obs are views into the columns: valid until ``_restart``."""
        assert self.dist is not None, "set by the first act"
        steps = slice(start, stop)
        obs = {k: np.concatenate([v[steps, i], last[k]]) for k, v in self.obs.items()}
        term = bool(self.terminated[stop - 1, i]) if ended else False
        trunc = bool(self.truncated[stop - 1, i]) if ended else False
        return Fragment(obs=obs, actions=self.actions[steps, i],
                        rewards=self.rewards[steps, i], is_terminated=term,
                        is_truncated=trunc, action_logp=self.logp[steps, i],
                        action_dist_inputs=self.dist[steps, i],
                        agent_id=self.agent_ids[i], episode_id=f"{self.nonce}-{number}",
                        policy_id=self.policy_names[i],
                        state_in=None if self.states is None
                        else self.states[start:stop:self.max_seq_len, i])

    def close(self) -> None:
        """Send any remaining steps (without waiting for weights) and disconnect."""
        try:
            self.link.exchange(self._split(), self.book.held(), get_state=False)
        except (ConnectionError, OSError):
            pass
        self.link.close()


__all__ = ["VectorClient"]


def _epsilon(local) -> float | None:
    """A DQN policy's epsilon-greedy rate (from its weights' message), else None."""
    return getattr(local.net, "epsilon", None)
