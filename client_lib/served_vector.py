"""Server-side inference for N lockstep copies of one simulator: the daemon chooses every action.

    client = connect_vector("shm", num_envs=64, inference="server")   # or "tcp://127.0.0.1:5555"
    actions = client.act(obs_batch)        # one round trip for all copies, one forward pass
    client.step(rewards, next_obs_batch, terminated, truncated)

Same ``act``/``step`` contract as the client-side ``VectorClient`` (gymnasium's same-step
autoreset: after copy i's episode ended, the next ``act``'s ``obs_batch[i]`` is its new
episode's first observation). Nothing here runs a network.

Over shared memory copy i is lane i of one lane area (``SERVE_ATTACH`` with ``lanes=N``):
``act`` writes every copy's request (START for a copy without an episode, else STEP with
the reward since its last action) and publishes them as one request group, which the
inference role answers in one pass with one weights version; ``step`` publishes the ENDs of
finished episodes without waiting (their answers arrive while the simulator steps). Over
TCP each ``act`` is one ``STEP_BATCH``: the previous ``step``'s ENDs, then one START or
STEP entry per copy; its ``ACTIONS`` reply carries the actions.

A lost connection or a daemon restart costs the episodes in progress: the link reconnects
and the copies start new episodes with the observations of that ``act``.
"""
from __future__ import annotations

import itertools
import secrets
from typing import Any

import numpy as np

from rlinkd.client_lib.protocol import serving
from rlinkd.client_lib.protocol.columns import (Columns, action_columns, action_vector, obs_columns,
                                                native, native_batch, to_columns)
from rlinkd.client_lib.protocol.spaces import Space, field_name, space_from_json
from rlinkd.client_lib.served import EpisodeLost, ServedShmLink, ServedTcpLink
from rlinkd.client_lib.transport import RLlinkError, ServerError
from rlinkd.shm.lanes import (EVALUATE, OP_END, OP_START, OP_STEP, STATUS_LOST, STATUS_MESSAGES,
                              STATUS_OK, TERMINATED, TRUNCATED)


class ServedVectorClient:
    """``num_envs`` agents acting and stepping in lockstep, actions chosen by the daemon."""

    def __init__(self, link: ServedShmLink | ServedTcpLink, num_envs: int,
                 evaluate: bool = False, policy: str | None = None) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        if isinstance(link, ServedShmLink) and link.lanes != num_envs:
            raise ValueError(f"the link asks for {link.lanes} lanes, not num_envs={num_envs}")
        self.n, self.evaluate = num_envs, evaluate
        link._with_retry(lambda: None)  # connect now: errors surface at connect_vector()
        assert link.config is not None
        self.obs_space = space_from_json(link.config.observation_space or {})
        self.act_space = space_from_json(link.config.action_space or {})
        self.wire: _ShmWire | _TcpWire = (
            _ShmWire(link, num_envs, evaluate) if isinstance(link, ServedShmLink)
            else _TcpWire(link, num_envs, evaluate, policy, self.obs_space, self.act_space))
        self.open = np.zeros(num_envs, bool)        # copies with an episode the daemon knows
        self.rewards = np.zeros(num_envs, np.float64)  # reward since each copy's last action
        self.weights_seq_nos = np.full(num_envs, -1, np.int64)
        self.pending = False
        self.lost_episodes = 0
        self.last_obs: Any = None  # the last step's next_obs_batch (final ones, if truncated)

    @property
    def link(self) -> ServedShmLink | ServedTcpLink:
        return self.wire.link

    def act(self, obs_batch: Any, explore: bool | None = None) -> Any:
        """Actions for all copies in a VectorEnv's batched form. ValueError if the last act
        was not stepped or ``explore`` contradicts the mode; InvalidValue for observations
        outside the space (nothing sent); ServerError when the daemon refuses some copies'
        requests (those copies start new episodes at the next ``act``)."""
        if explore is not None and explore == self.evaluate:
            raise ValueError("explore is decided by mode= for server-side inference")
        if self.pending:
            raise ValueError("act() again before step(): every act needs its step")
        x = obs_columns(obs_batch, self.obs_space, self.n, "obs", batched=True)
        try:
            vectors = self._exchange(x)
        except (ConnectionError, OSError, ServerError) as exc:
            if isinstance(exc, ServerError) and not exc.retry:
                raise
            self._recover()
            vectors = self.link._with_retry(lambda: self._exchange(x))
        self.pending = True
        return native_batch(action_columns(vectors, self.act_space), self.act_space)

    def _exchange(self, x: Columns) -> np.ndarray:
        """One round trip for every copy; copies whose episode the daemon lost start again."""
        vectors, seqs, status = self.wire.act(self.open, self.rewards.astype(np.float32), x)
        lost = status == STATUS_LOST
        if lost.any():
            self.lost_episodes += int(lost.sum())
            self.open[lost] = False
            again, again_seqs, again_status = self.wire.act(
                self.open, self.rewards.astype(np.float32), x, np.flatnonzero(lost))
            vectors[lost], seqs[lost], status[lost] = again, again_seqs, again_status
        self.rewards[:] = 0.0
        self.open[:] = status == STATUS_OK
        self.weights_seq_nos[:] = seqs
        if not self.open.all():
            raise _refused(status)
        return vectors

    def _recover(self) -> None:
        """The connection is gone with every episode on it: the next exchange starts them all."""
        self.lost_episodes += int(self.open.sum())
        self.open[:], self.rewards[:] = False, 0.0
        self.wire.reset()

    def step(self, rewards: Any, next_obs_batch: Any, terminated: Any, truncated: Any) -> None:
        """Record the rewards of the last actions; ended episodes are reported (ENDs sent,
        not awaited over shared memory; sent with the next ``act`` over TCP)."""
        if not self.pending:
            raise RuntimeError("step() must follow act()")
        self.rewards += np.asarray(rewards, np.float64).reshape(self.n)
        term = np.asarray(terminated, bool).reshape(self.n)
        trunc = np.asarray(truncated, bool).reshape(self.n)
        self.pending, self.last_obs = False, next_obs_batch
        rows = np.flatnonzero((term | trunc) & self.open)
        if len(rows):
            flags = np.where(term[rows], TERMINATED, 0) | np.where(trunc[rows], TRUNCATED, 0)
            self._end(rows, next_obs_batch, flags.astype(np.uint8))

    def truncate(self) -> None:
        """End every copy's episode in progress as truncated at its last step (final
        observations from the last ``step``): every copy's next ``act`` starts an episode.
        For a driver that resets its env mid-episode. ValueError if an action is pending."""
        if self.pending:
            raise ValueError("truncate(): an action is pending (step it first)")
        rows = np.flatnonzero(self.open)
        if len(rows) and self.last_obs is not None:
            self._end(rows, self.last_obs, np.full(len(rows), TRUNCATED, np.uint8))
        self.open[:], self.rewards[:] = False, 0.0

    def _end(self, rows: np.ndarray, next_obs_batch: Any, flags: np.ndarray) -> None:
        """END the episodes of copies ``rows`` with their final observations."""
        finals = obs_columns(next_obs_batch, self.obs_space, self.n, "next_obs", batched=True)
        try:
            self.wire.end(rows, self.rewards[rows].astype(np.float32), finals, flags)
        except (ConnectionError, OSError, ServerError) as exc:
            if isinstance(exc, ServerError) and not exc.retry:
                raise
            self._recover()
        self.open[rows], self.rewards[rows] = False, 0.0

    def close(self) -> None:
        self.wire.close()


class _ShmWire:
    """Copy i is lane i of the link's lane area; a request group per ``act``."""

    def __init__(self, link: ServedShmLink, n: int, evaluate: bool) -> None:
        link.lanes = n
        self.link, self.n, self.evaluate = link, n, evaluate
        self.all_rows = np.arange(n)
        self.ending = np.zeros(n, bool)  # lanes with an END not yet answered
        self.groups = (1 + i % 0xFFFFFFFF for i in itertools.count())

    def reset(self) -> None:
        self.ending[:] = False
        self.link.close()

    def act(self, open_: np.ndarray, rewards: np.ndarray, x: Columns,
            rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """START/STEP requests for ``rows`` (default: every copy) as one group, awaited:
        (action vectors, weights versions, statuses), one row each, in row order."""
        area = self.link._area()
        if self.ending.any():
            self._wait(np.flatnonzero(self.ending))  # the ENDs of the last step
            self.ending[:] = False
        rows = self.all_rows if rows is None else rows
        lanes = area.lanes
        self._write_obs(rows, x)
        lanes["op"][rows] = np.where(open_[rows], OP_STEP, OP_START)
        lanes["flags"][rows] = EVALUATE if self.evaluate else 0
        lanes["reward"][rows] = rewards[rows]
        self._publish(rows)
        self._wait(rows)
        return (np.array(lanes["action"][rows], np.float32), lanes["weights_seq_no"][rows].copy(),
                lanes["status"][rows].copy())

    def end(self, rows: np.ndarray, rewards: np.ndarray, finals: Columns, flags: np.ndarray) -> None:
        lanes = self.link._area().lanes
        self._write_obs(rows, finals)
        lanes["op"][rows], lanes["flags"][rows], lanes["reward"][rows] = OP_END, flags, rewards
        self._publish(rows)
        self.ending[rows] = True

    def _write_obs(self, rows: np.ndarray, x: Columns) -> None:
        obs = self.link._area().lanes["obs"]
        for key, column in x.items():
            obs[field_name(key)][rows] = column[rows] if len(rows) != self.n else column

    def _publish(self, rows: np.ndarray) -> None:
        area = self.link._area()
        area.publish_group(rows, next(self.groups))
        if area.take_server_sleeping():
            assert self.link.bells is not None
            self.link.bells[0].ring()

    def _wait(self, rows: np.ndarray) -> None:
        """Until every lane of ``rows`` is answered (``ServedShmLink.wait_answered``)."""
        area = self.link._area()
        self.link.wait_answered(lambda: area.answered_all(rows))

    def close(self) -> None:
        if self.ending.any() and self.link.area is not None:
            try:  # the last ENDs' steps still train
                self._wait(np.flatnonzero(self.ending))
            except (ConnectionError, OSError, ServerError):
                pass
        self.link.close()


class _TcpWire:
    """One STEP_BATCH per ``act``; copy i's episode has id ``f"{nonce}-{i}-{k}"``."""

    def __init__(self, link: ServedTcpLink, n: int, evaluate: bool, policy: str | None,
                 obs_space: Space, act_space: Space) -> None:
        self.link, self.n, self.evaluate, self.policy = link, n, evaluate, policy
        self.obs_space, self.act_space = obs_space, act_space
        self.nonce = secrets.token_hex(4)
        self.counter = itertools.count()
        self.ids = [""] * n
        self.ends: list[serving.BatchEntry] = []

    def reset(self) -> None:
        self.ends.clear()
        self.link.close()

    def act(self, open_: np.ndarray, rewards: np.ndarray, x: Columns,
            rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One STEP_BATCH (pending ENDs first) and its ACTIONS: (action vectors, weights
        versions, statuses) for ``rows`` (default: every copy). An ERROR raises."""
        client = self.link.serving_client()
        idx = range(self.n) if rows is None else rows.tolist()
        entries, self.ends = self.ends, []
        first = len(entries)
        for i in idx:
            entries.append(self._entry(i, bool(open_[i]), float(rewards[i]), native(x, self.obs_space, i)))
        client.send(serving.StepBatch(tuple(entries)))
        reply = client.recv()
        if not isinstance(reply, serving.Actions) or len(reply.actions) != len(entries):
            raise RLlinkError(f"expected ACTIONS for {len(entries)} entries, got {reply.TYPE.value}")
        vectors = _action_vectors(reply.actions[first:], self.act_space)
        seqs = np.array(reply.weights_seq_nos[first:], np.int64)
        return vectors, seqs, np.zeros(len(seqs), np.int32)

    def _entry(self, i: int, open_: bool, reward: float, obs) -> serving.BatchEntry:
        if open_:
            return serving.BatchEntry(self.ids[i], obs, reward=reward)
        self.ids[i] = f"{self.nonce}-{i}-{next(self.counter)}"
        return serving.BatchEntry(self.ids[i], obs, start=True, policy_id=self.policy,
                                  training_enabled=False if self.evaluate else None)

    def end(self, rows: np.ndarray, rewards: np.ndarray, finals: Columns, flags: np.ndarray) -> None:
        for row, reward, flag in zip(rows.tolist(), rewards.tolist(), flags.tolist()):
            self.ends.append(serving.BatchEntry(
                self.ids[row], native(finals, self.obs_space, row), reward=reward,
                terminated=bool(flag & TERMINATED), truncated=bool(flag & TRUNCATED)))

    def close(self) -> None:
        if self.ends and self.link.hot is not None:
            try:  # the last ENDs' steps still train
                self.link.hot.send(serving.StepBatch(tuple(self.ends)))
                self.link.hot.recv()
            except (ConnectionError, OSError, ServerError):
                pass
        self.link.close()


def _action_vectors(natives: list, space: Space) -> np.ndarray:
    """ACTIONS' native values -> action vectors [N, A] (as the lanes hold them)."""
    return action_vector(to_columns(natives, space, len(natives), "action"), space)


def _refused(status: np.ndarray) -> ServerError:
    bad = np.flatnonzero(status != STATUS_OK)
    code = int(status[bad[0]])
    return ServerError(f"copy {int(bad[0])}: {STATUS_MESSAGES.get(code, f'serving status {code}')}"
                       f" ({len(bad)} copies refused; they start new episodes at the next act)")


__all__ = ["EpisodeLost", "ServedVectorClient"]
