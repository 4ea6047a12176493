"""Serving connections' episodes: serving messages in, lane requests out, answers back as replies.

The one place that knows what a serving message (``protocol.serving``) asks of the lanes;
its shell is the inference role's ``DirectConnections`` (every serving connection, handed over
by the collector; the role answers them in its own loop, in a lane area of its own).

``Front.begin`` validates one message against the connection's episodes (episode id known
and open, observation inside the policy's space, limits) and either replies at once (bytes,
or None for no reply) or publishes requests and returns a ``Pending``: the lanes to wait
for, per policy, and ``finish()`` that turns their answers into the reply. Nothing here
blocks or rings a doorbell: the shell wakes the role (``LanePool.published``) and waits.
A refused message raises ``ServingError`` (a ``BadMessage``: ERROR to that client only).
"""
from __future__ import annotations

import itertools
import secrets
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from rlinkd.client_lib.protocol import codec, serving
from rlinkd.client_lib.protocol.codec import BadMessage
from rlinkd.client_lib.protocol.columns import action_columns, native, one_action, to_columns
from rlinkd.client_lib.protocol.spaces import Discrete, InvalidValue, Space, field_name
from rlinkd.client_lib.transport import EPISODE_LOST
from rlinkd.shm.lanes import (EVALUATE, MAX_GROUP, OP_END, OP_RELEASE, OP_START, OP_STEP, STATUS_LOST,
                              STATUS_MESSAGES, STATUS_OK, TERMINATED, TRUNCATED, LaneArea)

ENDED_MEMORY = 1024  # ended episode ids remembered per connection (to name the error)
FEW = 8  # a STEP_BATCH's entries of one policy up to this many are written and read lane by lane


class ServingError(BadMessage):
    """A serving request that cannot be carried out (unknown episode, no free lane...)."""


@dataclass
class EpisodeLane:
    """One open episode of a serving connection."""

    policy: str
    lane: int
    evaluate: bool
    started: bool = False      # the inference role has seen its first observation
    reward: float = 0.0        # LOG_RETURNS since the last action


@dataclass
class Episodes:
    """One connection's open episodes and the ids it ended lately."""

    open: dict[str, EpisodeLane] = field(default_factory=dict)
    ended: OrderedDict = field(default_factory=OrderedDict)


class LanePool:
    """One policy's lanes in one lane area: free lanes, and lanes on their way back to free."""

    def __init__(self, area: LaneArea, obs_space: Space, act_space: Space, name: str) -> None:
        self.area, self.obs_space, self.act_space, self.name = area, obs_space, act_space, name
        self.free = list(range(area.capacity - 1, -1, -1))
        self.draining: set[int] = set()   # closed connections' lanes with a request in flight
        self.releasing: set[int] = set()  # lanes with OP_RELEASE in flight: free once answered
        self.published = False            # a request went out since the shell last looked
        lanes, step = area.lanes, area.layout.step  # (field views made once: a view is ~0.3 us)
        self.op, self.flags, self.reward = lanes["op"], lanes["flags"], lanes["reward"]
        self.group, self.group_size = lanes["group"], lanes["group_size"]
        self.status, self.seq_no, self.action = lanes["status"], lanes["weights_seq_no"], lanes["action"]
        self.flat_obs = lanes["obs"][step.obs_fields[0][0]] if step.is_flat else None

    def take(self, what: str) -> int:
        if not self.free:
            raise ServingError(f"no free serving lane: {self.area.capacity} {what} episodes are "
                               "open on this daemon")
        return self.free.pop()

    def release(self, lane: int) -> None:
        """Publish OP_RELEASE on an idle lane (the role ends its open episode, if any: a
        request in flight when the connection closed may have opened one); the lane is
        free once that is answered."""
        row = self.area.lanes[lane:lane + 1]
        row["op"], row["flags"], row["group"] = OP_RELEASE, 0, 0
        self.area.publish(lane)
        self.releasing.add(lane)
        self.published = True

    def sweep(self) -> None:
        """Release drained lanes and free released ones, once answered."""
        for lane in [lane for lane in self.draining if self.area.answered(lane)]:
            self.draining.discard(lane)
            self.release(lane)
        for lane in [lane for lane in self.releasing if self.area.answered(lane)]:
            self.releasing.discard(lane)
            self.free.append(lane)

    @property
    def busy(self) -> bool:
        """Lanes still on their way back to free (the shell keeps sweeping)."""
        return bool(self.draining or self.releasing)


@dataclass
class Pending:
    """Published requests of one message: ``lanes`` per policy, then ``finish()`` -> reply."""

    lanes: dict[str, np.ndarray]
    finish: Callable[[], bytes | None]
    one: tuple[str, int] | None = None  # (policy, lane) when it waits for one lane (a STEP)

    def answered(self, pools: dict[str, LanePool]) -> bool:
        if self.one is not None:  # (the common case, in scalar code)
            return pools[self.one[0]].area.answered(self.one[1])
        return all(pools[name].area.answered_all(idx) for name, idx in self.lanes.items())


Outcome = bytes | None | Pending


class Front:
    """Serving messages of any number of connections against one lane pool per policy.
    ``what`` names the pools' kind in the no-free-lane error (the config key that sizes them)."""

    def __init__(self, pools: dict[str, LanePool], policy_for: Callable[[str | None], str],
                 max_episodes: int, what: str) -> None:
        self.pools, self.policy_for, self.max_episodes, self.what = pools, policy_for, max_episodes, what
        self.groups = (1 + i % 0xFFFFFFFF for i in itertools.count())  # STEP_BATCH ids, never 0
        self.episodes_started = 0

    def begin(self, eps: Episodes, msg: codec.Message) -> Outcome:
        """Carry out one serving message of a connection (see the module docstring)."""
        if isinstance(msg, serving.StartEpisode):
            eid = msg.episode_id or f"e{secrets.token_hex(8)}"
            ep = self._new_episode(eps, eid, msg.agent_id, msg.policy_id, msg.training_enabled)
            return codec.encode(serving.EpisodeStarted(eid, ep.policy))
        if isinstance(msg, serving.LogReturns):
            self._open(eps, msg.episode_id).reward += msg.reward
            return None
        if isinstance(msg, serving.GetAction):
            return self._act(eps, msg.episode_id, None, msg.observation)
        if isinstance(msg, serving.Step):
            if msg.terminated or msg.truncated:
                return self._end(eps, msg.episode_id, msg.reward, msg.observation, msg.terminated,
                                 msg.truncated, reply=True)
            return self._act(eps, msg.episode_id, msg.reward, msg.observation)
        if isinstance(msg, serving.EndEpisode):
            return self._end(eps, msg.episode_id, 0.0, msg.observation, msg.terminated, msg.truncated,
                             reply=False)
        if isinstance(msg, serving.StepBatch):
            return self._batch(eps, msg)
        raise BadMessage(f"{msg.TYPE.value} is not a serving request")

    # ------------------------------------------------------------ episodes
    def _new_episode(self, eps: Episodes, eid: str, agent_id: str | None, policy_id: str | None,
                     training_enabled: bool | None, ending: int = 0) -> EpisodeLane:
        """(``ending``: episodes this STEP_BATCH ends, which do not count against the limit.)"""
        if eid in eps.open:
            raise ServingError(f"episode {eid!r} is already open on this connection")
        if eid in eps.ended:
            raise ServingError(f"episode {eid!r} already ended")
        if len(eps.open) - ending >= self.max_episodes:
            raise ServingError(f"more than server.max_agents_per_connection={self.max_episodes} "
                               "episodes open on one connection")
        policy = policy_id or self.policy_for(agent_id)
        if policy not in self.pools:
            raise ServingError(f"unknown policy {policy!r} (known: {', '.join(self.pools)})")
        lane = self.pools[policy].take(self.what)
        ep = eps.open[eid] = EpisodeLane(policy, lane, training_enabled is False)
        self.episodes_started += 1
        return ep

    def _open(self, eps: Episodes, eid: str) -> EpisodeLane:
        ep = eps.open.get(eid)
        if ep is None:
            raise ServingError(f"episode {eid!r} already ended" if eid in eps.ended
                               else f"unknown episode {eid!r} (START_EPISODE first)")
        return ep

    def _finish(self, eps: Episodes, eid: str) -> None:
        ep = eps.open.pop(eid)
        self.pools[ep.policy].free.append(ep.lane)
        eps.ended[eid] = None
        while len(eps.ended) > ENDED_MEMORY:
            eps.ended.popitem(last=False)

    def forget(self, eps: Episodes) -> None:
        """The connection closed: its episodes' lanes go back (the role ends their
        fragments, truncated: OP_RELEASE, once any request in flight is answered)."""
        for ep in eps.open.values():
            pool = self.pools[ep.policy]
            if not pool.area.answered(ep.lane):
                pool.draining.add(ep.lane)  # released once its last request is answered
            elif ep.started:
                pool.release(ep.lane)
            else:
                pool.free.append(ep.lane)
        eps.open.clear()

    # ------------------------------------------------------------ one episode's requests
    def _act(self, eps: Episodes, eid: str, reward: float | None, obs) -> Pending:
        ep = self._open(eps, eid)
        if reward is not None and not ep.started:
            raise ServingError(f"episode {eid!r}: STEP before its first action (GET_ACTION)")
        self._publish(ep, OP_STEP if ep.started else OP_START, ep.reward + (reward or 0.0),
                      self._columns(ep.policy, [obs]), 0)
        ep.reward, ep.started = 0.0, True
        return self.resume(eps, eid, batch=False)

    def resume(self, eps: Episodes, eid: str, batch: bool) -> Pending:
        """The wait for the one request in flight in episode ``eid``'s lane: its reply an
        ACTION, or (``batch``) the ACTIONS of a STEP_BATCH of one step. Called for the
        requests published here, and for one the native path (fastpath.py) published and
        gave back before its answer was sent."""
        ep = eps.open[eid]

        def finish() -> bytes:
            seq = self._check(eps, eid, ep)
            if batch:
                return codec.encode(serving.Actions([self._action(ep)], [seq]))
            return codec.encode(serving.Action(eid, self._action(ep), seq))
        return Pending({ep.policy: np.array([ep.lane])}, finish, (ep.policy, ep.lane))

    def _end(self, eps: Episodes, eid: str, reward: float, obs, terminated: bool, truncated: bool,
             reply: bool) -> Outcome:
        ep = self._open(eps, eid)
        done = codec.encode(serving.Action(eid, None)) if reply else None
        if not ep.started:  # no action was ever asked for: nothing to record
            self._finish(eps, eid)
            return done
        flags = (TERMINATED if terminated else 0) | (TRUNCATED if truncated else 0)
        self._publish(ep, OP_END, ep.reward + reward, self._columns(ep.policy, [obs]), flags)

        def finish() -> bytes | None:
            self._check(eps, eid, ep)
            self._finish(eps, eid)
            return done
        return Pending({ep.policy: np.array([ep.lane])}, finish, (ep.policy, ep.lane))

    def _columns(self, policy: str, observations: list) -> dict:
        """Observations checked against the policy's space in one pass (BadMessage if one
        does not fit)."""
        try:
            return to_columns(observations, self.pools[policy].obs_space, len(observations), "observation")
        except InvalidValue as exc:
            raise BadMessage(str(exc)) from None

    def _publish(self, ep: EpisodeLane, op: int, reward: float, cols: dict, flags: int) -> None:
        """One request into the episode's lane (columns indexed by lane: the cheapest numpy
        writes of one structured row), then published."""
        pool, lane = self.pools[ep.policy], ep.lane
        if pool.flat_obs is not None and len(cols) == 1:  # (one float32 field: checked by _columns)
            (column,) = cols.values()
            pool.flat_obs[lane] = column[0]
        else:
            pool.area.layout.step.write_obs(pool.area.lanes[lane:lane + 1]["obs"],
                                            {field_name(k): v for k, v in cols.items()})
        pool.op[lane], pool.flags[lane] = op, flags | (EVALUATE if ep.evaluate else 0)
        pool.reward[lane], pool.group[lane], pool.group_size[lane] = reward, 0, 0
        pool.area.publish(lane)
        pool.published = True

    def _check(self, eps: Episodes, eid: str, ep: EpisodeLane) -> int:
        """The answer's weights version; ServingError (the episode closed) for a refusal."""
        pool = self.pools[ep.policy]
        status = int(pool.status[ep.lane])
        if status == STATUS_OK:
            return int(pool.seq_no[ep.lane])
        self._finish(eps, eid)
        if status == STATUS_LOST:  # (client_lib reconnects and starts a new episode on it)
            raise ServingError(f"{EPISODE_LOST} {eid!r}: a daemon restart lost it, start a new one")
        raise ServingError(f"episode {eid!r}: {STATUS_MESSAGES.get(status, f'status {status}')}")

    def _action(self, ep: EpisodeLane):
        """The lane's action in its JSON form (a Discrete one in plain Python: every step)."""
        pool = self.pools[ep.policy]
        return one_action(pool.action[ep.lane], pool.act_space)

    # ------------------------------------------------------------ STEP_BATCH
    def _batch(self, eps: Episodes, msg: serving.StepBatch) -> Pending:
        """Check every entry, then publish each policy's entries as one group (as lone
        requests when at most one wants an action: ``_publish_group``); ACTIONS in entry
        order once every lane is answered. (Nothing is published unless every entry is
        valid: a group the role waits to see whole must never be left half published.)"""
        if len(msg.steps) > MAX_GROUP:
            raise ServingError(f"STEP_BATCH: more than {MAX_GROUP} entries")
        if len(msg.steps) == 1 and not (msg.steps[0].start or msg.steps[0].ends):
            return self._batch_of_one(eps, msg.steps[0])
        checked, by_policy, columns = self._check_batch(eps, msg)
        group = next(self.groups)
        for name, rows in by_policy.items():
            self._publish_group(name, [checked[i] for i in rows], columns[name], group)

        def finish() -> bytes:
            actions: list = [None] * len(checked)
            seqs: list[int] = [-1] * len(checked)
            for name, rows in by_policy.items():
                self._collect(eps, name, [(msg.steps[i], checked[i][0], i) for i in rows], actions, seqs)
            return codec.encode(serving.Actions(actions, seqs))
        return Pending({name: np.array([checked[i][0].lane for i in rows]) for name, rows in by_policy.items()},
                       finish)

    def _batch_of_one(self, eps: Episodes, e: serving.BatchEntry) -> Pending:
        """A STEP_BATCH of one step (a C client's every step): ``_batch``'s checks and
        reply, through the lone STEP's scalar path (a group of one is served as a lone
        request anyway)."""
        ep = self._open(eps, e.episode_id)
        if not ep.started:
            raise ServingError(f"steps[{e.episode_id!r}]: a step before the episode's first action")
        self._publish(ep, OP_STEP, ep.reward + (e.reward or 0.0), self._columns(ep.policy, [e.observation]), 0)
        ep.reward = 0.0
        return self.resume(eps, e.episode_id, batch=True)

    def _check_batch(self, eps: Episodes, msg: serving.StepBatch) -> tuple[list, dict, dict]:
        """(checked entries, entry indices per policy, observation columns per policy). A
        refused entry raises (the connection then closes, releasing what this batch opened)."""
        ending = sum(e.ends for e in msg.steps)
        checked = [self._entry(eps, e, ending) for e in msg.steps]
        by_policy: dict[str, list[int]] = {}
        for i, (ep, *_rest) in enumerate(checked):
            by_policy.setdefault(ep.policy, []).append(i)
        columns = {name: self._columns(name, [msg.steps[i].observation for i in rows])
                   for name, rows in by_policy.items()}
        return checked, by_policy, columns

    def _entry(self, eps: Episodes, e: serving.BatchEntry, ending: int) -> tuple:
        """(episode, op, reward, flags) of one STEP_BATCH entry, checked."""
        if e.start:
            ep = self._new_episode(eps, e.episode_id, e.agent_id, e.policy_id, e.training_enabled, ending)
        else:
            ep = self._open(eps, e.episode_id)
            if not ep.started:
                raise ServingError(f"steps[{e.episode_id!r}]: a step before the episode's first action")
        flags = (TERMINATED if e.terminated else 0) | (TRUNCATED if e.truncated else 0)
        op = OP_END if e.ends else OP_STEP if ep.started else OP_START
        return ep, op, ep.reward + (e.reward or 0.0), flags

    def _publish_group(self, policy: str, checked: list[tuple], cols: dict, group: int) -> None:
        """One policy's entries into their lanes, published as group ``group`` (the role
        answers it in one pass, with one weights version) -- or as lone requests when at most
        one of them wants an action (a C client's deferred END with its next START: one
        version is trivially kept, and lone requests take the role's native path)."""
        pool = self.pools[policy]
        idx = np.array([ep.lane for ep, *_ in checked])
        if len(checked) <= FEW and pool.flat_obs is not None and len(cols) == 1:
            self._write_few(pool, checked, next(iter(cols.values())))
        else:
            lanes = pool.area.lanes
            for key, column in cols.items():
                lanes["obs"][field_name(key)][idx] = column
            lanes["op"][idx] = [op for _, op, _, _ in checked]
            lanes["flags"][idx] = [flags | (EVALUATE if ep.evaluate else 0) for ep, _, _, flags in checked]
            lanes["reward"][idx] = [reward for _, _, reward, _ in checked]
        for ep, *_ in checked:
            ep.reward, ep.started = 0.0, True
        acting = sum(op != OP_END for _, op, _, _ in checked)
        pool.area.publish_group(idx, group if acting > 1 else 0)
        pool.published = True

    @staticmethod
    def _write_few(pool: LanePool, checked: list[tuple], column: np.ndarray) -> None:
        """``_publish_group``'s writes for a few entries of a flat observation, lane by lane
        (numpy's fancy-indexed writes cost more for two rows than scalar ones)."""
        for k, (ep, op, reward, flags) in enumerate(checked):
            lane = ep.lane
            pool.flat_obs[lane] = column[k]  # type: ignore[index]
            pool.op[lane], pool.flags[lane] = op, flags | (EVALUATE if ep.evaluate else 0)
            pool.reward[lane] = reward

    def _collect(self, eps: Episodes, policy: str, entries: list[tuple], actions: list,
                 seqs: list[int]) -> None:
        """One policy's answers into ``actions``/``seqs`` (entry order); ended episodes closed;
        a refused entry raises after its episode is closed."""
        pool = self.pools[policy]
        if len(entries) <= FEW and type(pool.act_space) is Discrete:
            return self._collect_few(eps, pool, entries, actions, seqs)
        idx = np.array([ep.lane for _, ep, _ in entries])
        rows = pool.area.lanes[idx]
        cols = action_columns(np.array(rows["action"], np.float32), pool.act_space)
        for k, (entry, ep, i) in enumerate(entries):
            status = int(rows["status"][k])
            if status != STATUS_OK:
                self._check(eps, entry.episode_id, ep)
            if entry.ends:
                self._finish(eps, entry.episode_id)
            else:
                actions[i], seqs[i] = native(cols, pool.act_space, k), int(rows["weights_seq_no"][k])

    def _collect_few(self, eps: Episodes, pool: LanePool, entries: list[tuple], actions: list,
                     seqs: list[int]) -> None:
        """``_collect`` for a few entries of a Discrete policy, lane by lane (the same
        checks in the same order)."""
        for entry, ep, i in entries:
            if int(pool.status[ep.lane]) != STATUS_OK:
                self._check(eps, entry.episode_id, ep)
            if entry.ends:
                self._finish(eps, entry.episode_id)
            else:
                actions[i], seqs[i] = self._action(ep), int(pool.seq_no[ep.lane])
