"""The collector's side of server-side actions (the serving messages of ``protocol.serving``).

TCP (and Unix-socket) action clients: every open episode of a connection holds one lane of
its policy's TCP lane area (a file made by the wiring, at most ``inference.tcp_lanes``). A
request is validated here (episode id known and open, observation inside the space), written
into the lane and published; the inference role answers in the lane and rings the TCP
response doorbell, on which this module resolves the waiting request. A connection has at
most ``server.max_agents_per_connection`` episodes open, each with at most one request in
flight: that bounds what one client can ask; a client that does not read its replies stalls
only its own connection (``server.read_timeout_s`` on the write closes it).

Shared-memory action clients (SERVE_ATTACH on the Unix socket): a sealed memfd lane area of
their own plus a response doorbell, handed to the client with the request doorbell, and to
the inference role over the area channel; the requests never touch a socket.
"""
from __future__ import annotations

import asyncio
import itertools
import os
import secrets
import socket
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import structlog

from rlinkd.client_lib.protocol import codec, serving
from rlinkd.client_lib.protocol.codec import BadMessage
from rlinkd.client_lib.protocol.columns import action_columns, native, to_columns
from rlinkd.client_lib.protocol.spaces import InvalidValue, field_name
from rlinkd.client_lib.transport import EPISODE_LOST
from rlinkd.daemon.collector.core import Session
from rlinkd.daemon.collector.ingest import PolicyInfo
from rlinkd.daemon.collector.shm_server import send_fds
from rlinkd.daemon.inference import channel
from rlinkd.daemon.wiring import Topology
from rlinkd.shm.doorbell import Doorbell
from rlinkd.shm.lanes import (EVALUATE, MAX_GROUP, OP_END, OP_RELEASE, OP_START, OP_STEP, STATUS_LOST,
                              STATUS_MESSAGES, STATUS_OK, TERMINATED, TRUNCATED, LaneArea, LaneLayout)

log = structlog.get_logger("collector")
ENDED_MEMORY = 1024  # ended episode ids remembered per connection (to name the error)
ANSWER_TIMEOUT_S = 30.0


SPIN_S = 60e-6


def _spin_until_answered(area: LaneArea, lane: int) -> bool:
    """Busy-wait up to SPIN_S for one answer (only for a lone request: the event loop has
    nothing else waiting on the inference role then)."""
    until = time.perf_counter() + SPIN_S
    while time.perf_counter() < until:
        if area.answered(lane):
            return True
    return False


def _time_out(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_exception(ConnectionError("the inference role did not answer"))


class ServingError(BadMessage):
    """A serving request that cannot be carried out (unknown episode, no free lane...)."""


@dataclass
class EpisodeLane:
    """One open episode of a TCP action client."""

    policy: str
    lane: int
    evaluate: bool
    started: bool = False      # the inference role has seen its first observation
    reward: float = 0.0        # LOG_RETURNS since the last action


@dataclass
class ServingSession:
    episodes: dict[str, EpisodeLane] = field(default_factory=dict)
    ended: OrderedDict = field(default_factory=OrderedDict)
    area_id: int = -1          # its shared-memory lane area, if any
    area: LaneArea | None = None
    area_policy: str = ""
    bell_fd: int = -1
    writer: Any = None         # its connection's stream writer (closed if the role refuses the area)


class TcpLanes:
    """One policy's TCP lane area: free lanes and the requests waiting for answers."""

    def __init__(self, path: str, layout: LaneLayout, info: PolicyInfo) -> None:
        self.area = LaneArea.attach(path, layout)
        self.area.set_pid("writer", os.getpid())
        self.info = info
        self.free = list(range(self.area.capacity - 1, -1, -1))
        self.waiting: dict[int, asyncio.Future] = {}
        self.draining: set[int] = set()   # closed connections' lanes with a request in flight
        self.releasing: set[int] = set()  # lanes with OP_RELEASE in flight: free once answered

    def take(self) -> int:
        if not self.free:
            raise ServingError(f"no free serving lane: inference.tcp_lanes={self.area.capacity} "
                               "episodes are open on this daemon")
        return self.free.pop()


class ServingFront:
    """Built by the collector process; ``handle`` is called from a connection's read loop."""

    def __init__(self, topo: Topology, policies: dict[str, PolicyInfo]) -> None:
        self.topo, self.cfg = topo, topo.cfg
        self.lanes = {name: TcpLanes(p.tcp_lanes_path, LaneLayout(p.layout), policies[name])
                      for name, p in topo.policies.items()}
        self.request_bell = Doorbell(os.dup(topo.request_doorbell.fd))
        self.response_bell = Doorbell(os.dup(topo.tcp_response_doorbell.fd))
        self.channel = socket.socket(fileno=os.dup(topo.area_channel[0].fd))
        self.channel.setblocking(False)
        self.sessions: dict[int, ServingSession] = {}
        self.area_ids = itertools.count(1)
        self.groups = (1 + i % 0xFFFFFFFF for i in itertools.count())  # STEP_BATCH ids, never 0
        self.max_episodes = self.cfg.server.max_agents_per_connection
        self.counts = {"episodes_started": 0, "tcp_messages": 0, "shm_clients": 0}

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        loop.add_reader(self.response_bell.fileno(), self.on_responses)
        loop.add_reader(self.channel.fileno(), self.on_channel)
        self._channel_send(channel.ChannelMessage("reset"))

    def stop(self) -> None:
        loop = asyncio.get_running_loop()
        loop.remove_reader(self.response_bell.fileno())
        loop.remove_reader(self.channel.fileno())

    # ------------------------------------------------------------ dispatch
    async def handle(self, session: Session, msg: codec.Message, writer) -> bytes | None:
        """Carry out one serving message; the reply frame (None: no reply)."""
        state = self.sessions.setdefault(session.id, ServingSession())
        self.counts["tcp_messages"] += 1
        if isinstance(msg, serving.StartEpisode):
            return self._start(session, state, msg)
        if isinstance(msg, serving.LogReturns):
            self._open(state, msg.episode_id).reward += msg.reward
            return None
        if isinstance(msg, serving.GetAction):
            return await self._act(state, msg.episode_id, None, msg.observation)
        if isinstance(msg, serving.Step):
            if msg.terminated or msg.truncated:
                await self._end(state, msg.episode_id, msg.reward, msg.observation, msg.terminated,
                                msg.truncated)
                return codec.encode(serving.Action(msg.episode_id, None))
            return await self._act(state, msg.episode_id, msg.reward, msg.observation)
        if isinstance(msg, serving.EndEpisode):
            await self._end(state, msg.episode_id, 0.0, msg.observation, msg.terminated, msg.truncated)
            return None
        if isinstance(msg, serving.StepBatch):
            return await self._batch(session, state, msg)
        if isinstance(msg, serving.ServeAttach):
            await self._attach(session, state, msg, writer)
            return None
        raise BadMessage(f"{msg.TYPE.value} is not a serving request")

    # ------------------------------------------------------------ episodes
    def _start(self, session: Session, state: ServingSession, msg: serving.StartEpisode) -> bytes:
        eid = msg.episode_id or f"e{session.id}-{secrets.token_hex(6)}"
        self._new_episode(state, eid, msg.agent_id, msg.policy_id, msg.training_enabled)
        return codec.encode(serving.EpisodeStarted(eid, state.episodes[eid].policy))

    def _new_episode(self, state: ServingSession, eid: str, agent_id: str | None,
                     policy_id: str | None, training_enabled: bool | None,
                     ending: int = 0) -> EpisodeLane:
        """(``ending``: episodes this STEP_BATCH ends, which do not count against the limit.)"""
        if eid in state.episodes:
            raise ServingError(f"episode {eid!r} is already open on this connection")
        if eid in state.ended:
            raise ServingError(f"episode {eid!r} already ended")
        if len(state.episodes) - ending >= self.max_episodes:
            raise ServingError(f"more than server.max_agents_per_connection={self.max_episodes} "
                               "episodes open on one connection")
        policy = policy_id or self.topo.mapping.policy_for(agent_id)
        if policy not in self.lanes:
            raise ServingError(f"unknown policy {policy!r} (known: {', '.join(self.lanes)})")
        lane = self.lanes[policy].take()
        ep = state.episodes[eid] = EpisodeLane(policy, lane, training_enabled is False)
        self.counts["episodes_started"] += 1
        return ep

    def _open(self, state: ServingSession, eid: str) -> EpisodeLane:
        ep = state.episodes.get(eid)
        if ep is None:
            raise ServingError(f"episode {eid!r} already ended" if eid in state.ended
                               else f"unknown episode {eid!r} (START_EPISODE first)")
        return ep

    def _finish(self, state: ServingSession, eid: str) -> None:
        ep = state.episodes.pop(eid)
        self.lanes[ep.policy].free.append(ep.lane)
        state.ended[eid] = None
        while len(state.ended) > ENDED_MEMORY:
            state.ended.popitem(last=False)

    # ------------------------------------------------------------ requests
    def _write(self, ep: EpisodeLane, op: int, reward: float, obs, flags: int = 0,
               group: tuple[int, int] = (0, 0)) -> None:
        """Validate ``obs`` and publish one request in the episode's lane."""
        self._publish(ep, op, reward, self._columns(ep, obs), flags, group)

    def _columns(self, ep: EpisodeLane, obs) -> dict:
        """``obs`` checked against the episode's policy's space (BadMessage if it does not fit)."""
        try:
            return to_columns([obs], self.lanes[ep.policy].info.spaces.obs, 1, "observation")
        except InvalidValue as exc:
            raise BadMessage(str(exc)) from None

    def _publish(self, ep: EpisodeLane, op: int, reward: float, cols: dict, flags: int,
                 group: tuple[int, int]) -> None:
        """One request into the episode's lane (``group``: (id, size) of a STEP_BATCH, which
        the inference role answers in one pass, so with one weights version)."""
        tl = self.lanes[ep.policy]
        row = tl.area.lanes[ep.lane:ep.lane + 1]
        tl.area.layout.step.write_obs(row["obs"], {field_name(k): v for k, v in cols.items()})
        row["op"], row["flags"], row["reward"] = op, flags | (EVALUATE if ep.evaluate else 0), reward
        row["group"], row["group_size"] = group
        tl.area.publish(ep.lane)

    async def _answer(self, ep: EpisodeLane) -> tuple[int, int]:
        """Wait for the lane's answer: (status, weights_seq_no)."""
        tl = self.lanes[ep.policy]
        if tl.area.take_server_sleeping():
            self.request_bell.ring()
        elif not tl.waiting and _spin_until_answered(tl.area, ep.lane):
            row = tl.area.lanes[ep.lane]  # a lone request to an awake role: no loop turn
            return int(row["status"]), int(row["weights_seq_no"])
        fut = asyncio.get_running_loop().create_future()
        tl.waiting[ep.lane] = fut
        tl.area.announce_client_wait()
        if tl.area.answered(ep.lane):
            self._resolve(tl, ep.lane)
        timer = asyncio.get_running_loop().call_later(ANSWER_TIMEOUT_S, _time_out, fut)
        try:
            await fut  # (not wait_for: that costs a task and a loop turn per request)
        finally:
            timer.cancel()
        row = tl.area.lanes[ep.lane]
        return int(row["status"]), int(row["weights_seq_no"])

    def _check(self, state: ServingSession, eid: str, status: int) -> None:
        if status == STATUS_OK:
            return
        self._finish(state, eid)
        if status == STATUS_LOST:  # (client_lib reconnects and starts a new episode on it)
            raise ServingError(f"{EPISODE_LOST} {eid!r}: a daemon restart lost it, start a new one")
        raise ServingError(f"episode {eid!r}: {STATUS_MESSAGES.get(status, f'status {status}')}")

    async def _act(self, state: ServingSession, eid: str, reward: float | None, obs) -> bytes:
        ep = self._open(state, eid)
        if reward is not None and not ep.started:
            raise ServingError(f"episode {eid!r}: STEP before its first action (GET_ACTION)")
        op = OP_STEP if ep.started else OP_START
        self._write(ep, op, ep.reward + (reward or 0.0), obs)
        ep.reward, ep.started = 0.0, True
        status, seq = await self._answer(ep)
        self._check(state, eid, status)
        return codec.encode(serving.Action(eid, self._action(ep), seq))

    def _action(self, ep: EpisodeLane):
        tl = self.lanes[ep.policy]
        vec = np.array(tl.area.lanes["action"][ep.lane], np.float32)[None]
        return native(action_columns(vec, tl.info.spaces.act), tl.info.spaces.act, 0)

    async def _end(self, state: ServingSession, eid: str, reward: float, obs, terminated: bool,
                   truncated: bool) -> None:
        ep = self._open(state, eid)
        if not ep.started:  # no action was ever asked for: nothing to record
            self._finish(state, eid)
            return
        flags = (TERMINATED if terminated else 0) | (TRUNCATED if truncated else 0)
        self._write(ep, OP_END, ep.reward + reward, obs, flags)
        status, _ = await self._answer(ep)
        self._check(state, eid, status)
        self._finish(state, eid)

    async def _batch(self, session: Session, state: ServingSession, msg: serving.StepBatch) -> bytes:
        """Check every entry, then publish each policy's entries as one group, await every
        answer; ACTIONS in entry order. (Nothing is published unless every entry is valid: a
        group the role waits to see whole must never be left half published.)"""
        if len(msg.steps) > MAX_GROUP:
            raise ServingError(f"STEP_BATCH: more than {MAX_GROUP} entries")
        checked, by_policy, columns = self._check_batch(state, msg)
        group = next(self.groups)
        for name, rows in by_policy.items():
            self._publish_group(name, [checked[i] for i in rows], columns[name], group)
        actions: list = [None] * len(checked)
        seqs: list[int] = [-1] * len(checked)
        for name, rows in by_policy.items():
            await self._await_group(name, [checked[i][0] for i in rows])
            self._collect(state, name, [(msg.steps[i], checked[i][0], i) for i in rows], actions, seqs)
        return codec.encode(serving.Actions(actions, seqs))

    def _check_batch(self, state: ServingSession, msg: serving.StepBatch) -> tuple[list, dict, dict]:
        """(checked entries, entry indices per policy, observation columns per policy). A
        refused entry raises (the connection then closes, releasing what this batch opened)."""
        ending = sum(e.ends for e in msg.steps)
        checked = [self._entry(state, e, ending) for e in msg.steps]
        by_policy: dict[str, list[int]] = {}
        for i, (ep, *_rest) in enumerate(checked):
            by_policy.setdefault(ep.policy, []).append(i)
        columns = {name: self._batch_columns(name, [msg.steps[i].observation for i in rows])
                   for name, rows in by_policy.items()}
        return checked, by_policy, columns

    def _entry(self, state: ServingSession, e: serving.BatchEntry, ending: int) -> tuple:
        """(episode, op, reward, flags) of one STEP_BATCH entry, checked."""
        if e.start:
            ep = self._new_episode(state, e.episode_id, e.agent_id, e.policy_id, e.training_enabled,
                                   ending)
        else:
            ep = self._open(state, e.episode_id)
            if not ep.started:
                raise ServingError(f"steps[{e.episode_id!r}]: a step before the episode's first action")
        flags = (TERMINATED if e.terminated else 0) | (TRUNCATED if e.truncated else 0)
        op = OP_END if e.ends else OP_STEP if ep.started else OP_START
        return ep, op, ep.reward + (e.reward or 0.0), flags

    def _batch_columns(self, policy: str, observations: list) -> dict:
        """One policy's STEP_BATCH observations checked against its space in one pass."""
        try:
            return to_columns(observations, self.lanes[policy].info.spaces.obs, len(observations),
                              "observation")
        except InvalidValue as exc:
            raise BadMessage(str(exc)) from None

    def _publish_group(self, policy: str, checked: list[tuple], cols: dict, group: int) -> None:
        """One policy's entries into their lanes, published as group ``group`` (the role
        answers it in one pass, with one weights version)."""
        tl = self.lanes[policy]
        idx = np.array([ep.lane for ep, *_ in checked])
        lanes = tl.area.lanes
        for key, column in cols.items():
            lanes["obs"][field_name(key)][idx] = column
        lanes["op"][idx] = [op for _, op, _, _ in checked]
        lanes["flags"][idx] = [flags | (EVALUATE if ep.evaluate else 0) for ep, _, _, flags in checked]
        lanes["reward"][idx] = [reward for _, _, reward, _ in checked]
        for ep, *_ in checked:
            ep.reward, ep.started = 0.0, True
        tl.area.publish_group(idx, group)

    async def _await_group(self, policy: str, eps: list[EpisodeLane]) -> None:
        """Until every lane of a published group is answered: the role answers a group in
        one pass, so once the first is, the others are within a few stores (checked, with
        a bound: then each is awaited on its own)."""
        tl = self.lanes[policy]
        await self._answer(eps[0])
        idx = np.array([ep.lane for ep in eps])
        until = time.perf_counter() + SPIN_S
        while not tl.area.answered_all(idx):
            if time.perf_counter() > until:
                await asyncio.gather(*(self._answer(ep) for ep in eps[1:]))
                return

    def _collect(self, state: ServingSession, policy: str, entries: list[tuple], actions: list,
                 seqs: list[int]) -> None:
        """One policy's answers into ``actions``/``seqs`` (entry order); ended episodes closed;
        a refused entry raises after its episode is closed."""
        tl = self.lanes[policy]
        idx = np.array([ep.lane for _, ep, _ in entries])
        rows = tl.area.lanes[idx]
        space = tl.info.spaces.act
        cols = action_columns(np.array(rows["action"], np.float32), space)
        for k, (entry, _ep, i) in enumerate(entries):
            self._check(state, entry.episode_id, int(rows["status"][k]))
            if entry.ends:
                self._finish(state, entry.episode_id)
            else:
                actions[i], seqs[i] = native(cols, space, k), int(rows["weights_seq_no"][k])

    # ------------------------------------------------------------ responses
    def on_responses(self) -> None:
        """Event-loop reader: the inference role answered some TCP lanes."""
        self.response_bell.drain()
        for tl in self.lanes.values():
            self._sweep(tl)
            if tl.waiting or tl.releasing or tl.draining:
                tl.area.announce_client_wait()
                self._sweep(tl)  # answers that came before the announcement

    def _sweep(self, tl: TcpLanes) -> None:
        """Resolve answered requests, release drained lanes, free released ones."""
        for lane in [lane for lane in tl.waiting if tl.area.answered(lane)]:
            self._resolve(tl, lane)
        for lane in [lane for lane in tl.draining if tl.area.answered(lane)]:
            tl.draining.discard(lane)
            self._release(tl, lane)
        for lane in [lane for lane in tl.releasing if tl.area.answered(lane)]:
            tl.releasing.discard(lane)
            tl.free.append(lane)

    def _release(self, tl: TcpLanes, lane: int) -> None:
        """Publish OP_RELEASE on an idle lane (the role ends its open episode, if any: a
        request in flight when the connection closed may have opened one); the lane is
        free once that is answered."""
        row = tl.area.lanes[lane:lane + 1]
        row["op"], row["flags"], row["group"] = OP_RELEASE, 0, 0
        tl.area.publish(lane)
        tl.releasing.add(lane)
        if tl.area.take_server_sleeping():
            self.request_bell.ring()
        tl.area.announce_client_wait()

    @staticmethod
    def _resolve(tl: TcpLanes, lane: int) -> None:
        fut = tl.waiting.pop(lane, None)
        if fut is not None and not fut.done():
            fut.set_result(None)

    def forget(self, session: Session) -> None:
        """The connection closed: release its episodes' lanes (the inference role ends their
        fragments, truncated) and its shared-memory area."""
        state = self.sessions.pop(session.id, None)
        if state is None:
            return
        for ep in state.episodes.values():
            tl = self.lanes[ep.policy]
            if ep.lane in tl.waiting or not tl.area.answered(ep.lane):
                tl.waiting.pop(ep.lane, None)
                tl.draining.add(ep.lane)  # released once its last request is answered
                tl.area.announce_client_wait()
            elif ep.started:
                self._release(tl, ep.lane)
            else:
                tl.free.append(ep.lane)
        if state.area is not None:
            self._channel_send(channel.ChannelMessage("close", state.area_id))
            state.area.close()
            os.close(state.bell_fd)
            self.counts["shm_clients"] -= 1

    # ------------------------------------------------------------ shared-memory clients
    async def _attach(self, session: Session, state: ServingSession, msg: serving.ServeAttach,
                      writer) -> None:
        if session.transport != "unix":
            raise BadMessage("SERVE_ATTACH is only accepted on the daemon's Unix socket")
        if state.area is not None:
            raise BadMessage("this connection already has a lane area")
        if not 1 <= msg.lanes <= min(self.max_episodes, MAX_GROUP):
            raise BadMessage(f"SERVE_ATTACH: lanes must be 1..{min(self.max_episodes, MAX_GROUP)} "
                             f"(server.max_agents_per_connection={self.max_episodes})")
        policy = msg.policy or self.topo.mapping.policy_for(None)
        if policy not in self.lanes:
            raise BadMessage(f"SERVE_ATTACH: unknown policy {policy!r}")
        p = self.topo.policies[policy]
        name = f"{self.topo.shm_prefix}.serve-{session.id}-{secrets.token_hex(4)}"
        area = LaneArea.create_sealed(name, LaneLayout(p.layout), msg.lanes)
        state.area, state.area_id, state.area_policy = area, next(self.area_ids), policy
        state.writer = writer
        state.bell_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        assert area.segment.fd is not None
        writer.write(codec.encode(serving.ServeAttached(
            name, msg.lanes, area.layout.to_json(), policy, p.obs_space.to_json(), p.act_space.to_json())))
        await send_fds(writer, [area.segment.fd, self.request_bell.fileno(), state.bell_fd],
                       self.cfg.server.read_timeout_s)
        self._announce(state)
        self.counts["shm_clients"] += 1
        log.info("shm_action_client_attached", session=session.id, lanes=msg.lanes, policy=policy)

    def _announce(self, state: ServingSession) -> None:
        assert state.area is not None and state.area.segment.fd is not None
        self._channel_send(channel.ChannelMessage("open", state.area_id, state.area_policy,
                                                  state.area.segment.path,
                                                  (state.area.segment.fd, state.bell_fd)))

    def on_channel(self) -> None:
        """Event-loop reader: a (re)started inference role says hello: announce every area."""
        while (msg := channel.receive(self.channel)) is not None:
            for fd in msg.fds:
                os.close(fd)
            if msg.op == "hello":
                for state in self.sessions.values():
                    if state.area is not None:
                        self._announce(state)
            elif msg.op == "refuse":
                self._refused(msg.area_id)

    def _refused(self, area_id: int) -> None:
        """The inference role cannot serve this area (its header was scribbled over, or the
        role has no room): the client's connection is closed (its own fault, or it retries)."""
        for sid, state in self.sessions.items():
            if state.area_id == area_id and state.writer is not None:
                log.warning("shm_action_client_refused", session=sid, area_id=area_id)
                state.writer.close()

    def _channel_send(self, msg: channel.ChannelMessage) -> None:
        try:
            channel.send(self.channel, msg)
        except (BlockingIOError, BrokenPipeError, ConnectionError) as exc:
            log.warning("area_channel_send_failed", op=msg.op, error=str(exc))

    def status(self) -> dict:
        return {**self.counts, "tcp_episodes_open": sum(len(s.episodes) for s in self.sessions.values()),
                "tcp_lanes_free": {name: len(tl.free) for name, tl in self.lanes.items()}}
