"""Server-side inference for one agent: the daemon chooses every action.

    agent = connect("tcp://127.0.0.1:5555", inference="server")   # or "shm", "unix:///..."
    action = agent.act(obs)                      # one round trip (STEP: reward + obs -> action)
    agent.step(reward, next_obs, terminated, truncated)   # sends nothing unless the episode ended

Same ``act``/``step``/``close`` API as the client-side ``Agent``; nothing here runs a network.
Over TCP (or the Unix socket without shared memory) each action is one RLlink STEP round trip
(``protocol.serving``); over shared memory (``shm``, ``auto`` on the daemon's host) the
request goes into a lane of the client's own lane area and the answer comes back in the same
lane (``shm.lanes``), no socket on the hot path. ``mode="evaluate"``: greedy actions, and the
episodes never train (their returns reach the daemon's ``eval`` statistics).

A lost connection or a daemon restart costs only the episode in progress: the link reconnects
(with backoff, up to ``reconnect_timeout_s``) and the next ``act`` starts a new episode.
"""
from __future__ import annotations

import os
import secrets
import select
import socket
import time
from typing import Any

import numpy as np

from rlinkd.client_lib.links import ReconnectingLink
from rlinkd.client_lib.reporting import MetricBuffer
from rlinkd.client_lib.protocol import codec, serving
from rlinkd.client_lib.protocol.columns import obs_columns, one_action
from rlinkd.client_lib.protocol.spaces import Space, field_name, space_from_json
from rlinkd.client_lib.transport import Address, RLlinkClient, RLlinkError, ServerError
from rlinkd.shm.doorbell import Doorbell
from rlinkd.shm.lanes import (EVALUATE, OP_END, OP_START, OP_STEP, STATUS_LOST, STATUS_MESSAGES,
                              STATUS_OK, TERMINATED, TRUNCATED, LaneArea, LaneLayout)

SPIN_S = 250e-6      # busy-wait up to this long for an answer before sleeping on the doorbell
WAIT_SLICE_S = 1.0   # between checks that the daemon is still there
CLOSE_WAIT_S = 5.0   # close() waits this long for the answer to a last END sent without waiting


class EpisodeLost(ServerError):
    """The daemon no longer knows the episode (it restarted): start a new one."""


class ServedTcpLink(ReconnectingLink):
    """Serving messages over a TCP or Unix-socket RLlink connection.

    Two connections: ``client`` for PING, GET_CONFIG and METRICS, answered by the collector,
    and ``hot`` for the serving messages, answered by the inference process from its
    SERVE_DIRECT on. An inference process without room for it answers ERROR
    ``direct serving refused`` (retryable: the link reconnects with backoff)."""

    def __init__(self, address: Address, token: str | None, reconnect_timeout_s: float,
                 ssl_context=None) -> None:
        self.address, self.token, self.ssl_context = address, token, ssl_context
        self.reconnect_timeout_s, self.reconnects = reconnect_timeout_s, 0
        self.client: RLlinkClient | None = None
        self.hot: RLlinkClient | None = None
        self.config: codec.SetConfig | None = None
        self.generation = 0  # serving connections made: an episode lives on one of them

    def describe(self) -> str:
        return str(self.address)

    def _connect(self) -> None:
        self.close()  # (a serving connection left without its control one is replaced too)
        client = self._open()
        try:
            self.config = client.get_config()
            hot = self._serving()
        except BaseException:
            client.close()
            raise
        self.client, self.hot = client, hot
        self.generation += 1

    def _open(self) -> RLlinkClient:
        client = RLlinkClient(self.address, ssl_context=self.ssl_context).connect()
        try:
            client.ping(self.token)
        except BaseException:
            client.close()
            raise
        return client

    def _serving(self) -> RLlinkClient:
        """A second connection, handed to the inference process (SERVE_DIRECT)."""
        hot = self._open()
        try:
            hot.request(serving.ServeDirect(), serving.ServeDirectReady)
        except BaseException:
            hot.close()
            raise
        return hot

    def close(self) -> None:
        for c in {id(c): c for c in (self.hot, self.client) if c is not None}.values():
            c.close()
        self.client = self.hot = None

    def send_message(self, msg: codec.Message) -> None:
        """METRICS and the like go over ``client``, reopened alone when the daemon closed it
        (idle past ``server.idle_timeout_s`` while the serving connection carried every
        step), so the serving connection and its episodes live on. While the collector
        cannot be reached (it restarts; the inference role and the direct connection live
        on) the message is dropped and the next one tries again."""
        if self.hot is None:
            return super().send_message(msg)
        try:
            if self.client is None or _closed_by_peer(self.client):
                self._reopen_control()
            assert self.client is not None
            self.client.send(msg)
        except (ConnectionError, OSError, ServerError):
            if self.client is not None:
                self.client.close()
                self.client = None

    def _reopen_control(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None
        self.client = self._open()

    def _client(self) -> RLlinkClient:
        """``client``, or a connection error when either connection is missing (so that
        ``_with_retry`` reconnects both)."""
        if self.client is None or self.hot is None:
            raise ConnectionError(f"{self.describe()}: not connected")
        return self.client

    def serving_client(self) -> RLlinkClient:
        """The connection serving messages go over (ConnectionError when there is none)."""
        if self.hot is None:
            raise ConnectionError(f"{self.describe()}: not connected")
        return self.hot

    def start(self, episode_id: str, obs, evaluate: bool, policy: str | None) -> tuple[np.ndarray | object, int]:
        """START_EPISODE + GET_ACTION pipelined: one round trip."""
        client = self.serving_client()
        client.send(serving.StartEpisode(episode_id, False if evaluate else None, policy_id=policy))
        client.send(serving.GetAction(episode_id, obs))
        client.recv()  # EPISODE_STARTED (an ERROR raises here)
        return self._action(client.recv())

    def step(self, episode_id: str, reward: float, obs) -> tuple[object, int]:
        client = self.serving_client()
        client.send(serving.Step(episode_id, reward, obs))
        return self._action(client.recv())

    def end(self, episode_id: str, reward: float, obs, terminated: bool, truncated: bool) -> None:
        client = self.serving_client()
        client.send(serving.Step(episode_id, reward, obs, terminated, truncated))
        self._action(client.recv())

    @staticmethod
    def _action(msg: codec.Message) -> tuple[object, int]:
        if not isinstance(msg, serving.Action):
            raise RLlinkError(f"expected ACTION, got {msg.TYPE.value}")
        return msg.action, msg.weights_seq_no


class ServedShmLink(ReconnectingLink):
    """One lane of a shared-memory lane area (SERVE_ATTACH on the daemon's Unix socket)."""

    def __init__(self, socket_path: str, token: str | None, reconnect_timeout_s: float,
                 policy: str | None = None, lanes: int = 1) -> None:
        self.socket_path, self.token, self.policy, self.lanes = socket_path, token, policy, lanes
        self.reconnect_timeout_s, self.reconnects = reconnect_timeout_s, 0
        self.generation = 0  # lane areas attached: an episode lives in one of them
        self.client: RLlinkClient | None = None
        self.config: codec.SetConfig | None = None
        self.area: LaneArea | None = None
        self.bells: tuple[Doorbell, Doorbell] | None = None  # (request, response)
        self.in_flight = False
        self.wait_s = 0.0  # EWMA of the time answers take
        self.obs_space: Space | None = None
        self.act_space: Space | None = None
        self.flat_field = ""  # the one float32 obs field of a flat Box layout

    def describe(self) -> str:
        return self.socket_path

    def _connect(self) -> None:
        client = RLlinkClient(Address("unix", path=self.socket_path)).connect()
        try:
            client.ping(self.token)
            self.config = client.get_config()
            client.send(serving.ServeAttach(pid=os.getpid(), lanes=self.lanes, policy=self.policy))
            reply = client.recv()
            if not isinstance(reply, serving.ServeAttached):
                raise RLlinkError(f"expected SERVE_ATTACHED, got {reply.TYPE.value}")
            area_fd, request_fd, response_fd = receive_fds(client, serving.LANE_FD_COUNT)
            self.area = LaneArea.from_fd(area_fd, reply.area_name, LaneLayout.from_json(reply.layout))
            self.area.set_pid("writer", os.getpid())
            self.bells = (Doorbell.from_fd(request_fd), Doorbell.from_fd(response_fd))
            self.obs_space = space_from_json(reply.observation_space)
            self.act_space = space_from_json(reply.action_space)
            step = self.area.layout.step
            self.flat_field = step.obs_fields[0][0] if step.is_flat else ""
        except BaseException:
            client.close()
            self.close()
            raise
        self.client, self.in_flight = client, False
        self.generation += 1

    def close(self) -> None:
        if self.area is not None:
            self.area.close()
            self.area = None
        if self.bells is not None:
            for bell in self.bells:
                bell.close()
            self.bells = None
        if self.client is not None:
            self.client.close()
            self.client = None

    def finish(self, timeout_s: float) -> None:
        """Wait (polling, at most ``timeout_s``) until the request in flight (an END sent
        without waiting) is answered. Called by ``ServedAgent.close``: a lane area closed
        before its END is served makes the daemon end the fragment truncated, losing that
        last step. Returns early when the daemon closes the connection or sends an ERROR."""
        deadline = time.monotonic() + timeout_s
        sock = self.client.sock if self.client is not None else None
        while (self.in_flight and self.area is not None and sock is not None and not self.area.answered(0)
               and time.monotonic() < deadline):
            if select.select([sock], [], [], 0.001)[0]:
                break
        self.in_flight = False

    def request(self, op: int, reward: float, obs, flags: int, wait: bool = True) -> tuple[object, int]:
        """Write one request into lane 0, publish it, and (``wait``) return the answer."""
        area = self._area()
        if self.in_flight:
            self._wait(area)  # the previous END's answer
        lanes = area.lanes
        if obs is not None:
            self._write_obs(lanes, obs)
        lanes["op"][0], lanes["flags"][0], lanes["reward"][0] = op, flags, reward
        area.publish(0)
        if area.take_server_sleeping():
            assert self.bells is not None
            self.bells[0].ring()
        self.in_flight = True
        if not wait:
            return None, -1
        return self._wait(area)

    def wait_answered(self, answered) -> None:
        """Spin briefly while answers come fast, then sleep on the response doorbell until
        ``answered()``, checking the socket for a daemon that went away (its ERROR raises;
        EOF raises ConnectionError). Keeps ``wait_s``, the EWMA that decides spinning."""
        area = self._area()
        started = time.perf_counter()
        if self.wait_s < SPIN_S:  # answers come fast: spin for them (else sleep at once,
            deadline = started + SPIN_S  # leaving the CPU to the daemon and other clients)
            while not answered() and time.perf_counter() < deadline:
                os.sched_yield()  # (a daemon role preempted on this core goes on meanwhile)
        while not answered():
            area.announce_client_wait()
            if answered():
                break
            assert self.bells is not None and self.client is not None and self.client.sock is not None
            sock_fd = self.client.sock.fileno()
            ready, _, _ = select.select([self.bells[1].fileno(), sock_fd], [], [], WAIT_SLICE_S)
            if sock_fd in ready:
                self.client.recv()
            self.bells[1].drain()
        # (a sample capped at 2 spins: a long on-policy hold must not stop the spinning for long)
        self.wait_s += 0.1 * (min(time.perf_counter() - started, 2 * SPIN_S) - self.wait_s)

    def _area(self) -> LaneArea:
        if self.client is None or self.area is None:
            raise ConnectionError(f"{self.socket_path}: not connected")
        return self.area

    def _write_obs(self, lanes: np.ndarray, obs) -> None:
        """The observation into lane 0: a flat float array straight into the lane's field
        (the daemon checks it against the space), any other value through ``to_columns``."""
        assert self.obs_space is not None and self.area is not None
        if self.flat_field and isinstance(obs, np.ndarray) and obs.dtype.kind == "f":
            lanes["obs"][self.flat_field][0] = obs  # ValueError for a wrong shape
            return
        cols = obs_columns([obs], self.obs_space, 1, "obs")
        self.area.layout.step.write_obs(lanes[0:1]["obs"], {field_name(k): v for k, v in cols.items()})

    def _wait(self, area: LaneArea) -> tuple[object, int]:
        """Until lane 0 is answered (``wait_answered``); the answer or an error."""
        self.wait_answered(lambda: area.answered(0))
        self.in_flight = False
        row = area.lanes[0]
        status = int(row["status"])
        if status == STATUS_LOST:
            raise EpisodeLost(STATUS_MESSAGES[status], retry=True)
        if status != STATUS_OK:
            raise ServerError(STATUS_MESSAGES.get(status, f"serving status {status}"))
        assert self.act_space is not None
        return one_action(row["action"], self.act_space), int(row["weights_seq_no"])


def _closed_by_peer(client: RLlinkClient) -> bool:
    """The peer closed (or wrote to) a connection we only send on: readable means either."""
    if client.sock is None:
        return True
    poller = select.poll()  # (not select: descriptors may be numbered past 1023)
    poller.register(client.sock, select.POLLIN)
    return bool(poller.poll(0))


def receive_fds(client: RLlinkClient, count: int) -> list[int]:
    """The byte after SERVE_ATTACHED and the ``count`` descriptors it carries."""
    assert client.sock is not None
    data, fds, flags, _ = socket.recv_fds(client.sock, 1, count, socket.MSG_CMSG_CLOEXEC)
    if not data:
        raise ConnectionError("daemon closed the connection before sending the lane area")
    if data != codec.RING_FD_BYTE or len(fds) != count or flags & socket.MSG_CTRUNC:
        for fd in fds:
            os.close(fd)
        raise RLlinkError(f"expected {count} descriptors after SERVE_ATTACHED, got {len(fds)}")
    return fds


class ServedAgent:
    """One agent whose actions the daemon chooses (see the module docstring)."""

    def __init__(self, link: ServedTcpLink | ServedShmLink, evaluate: bool = False,
                 policy: str | None = None) -> None:
        self.link, self.evaluate, self.policy = link, evaluate, policy
        link._with_retry(lambda: None)  # connect now: errors surface at connect()
        assert link.config is not None
        self.obs_space = space_from_json(link.config.observation_space or {})
        self.act_space = space_from_json(link.config.action_space or {})
        self.episode_id: str | None = None
        self.reward = 0.0
        self.weights_seq_no = -1
        self.lost_episodes = 0
        self.generation = link.generation  # the link's connection the open episode lives on
        self.metrics = MetricBuffer(link.send_message)
        self.last_obs: Any = None  # the open episode's last next_obs (its final one, if truncated)
        self.pending = False       # an act not stepped yet

    def log_metric(self, name: str, value: float) -> None:
        """A scalar for TensorBoard ``client/<name>`` (see ``Agent.log_metric``)."""
        self.metrics.add(name, value)

    def act(self, obs, explore: bool | None = None):
        """The daemon's action for ``obs`` (starts an episode when none is open)."""
        if explore is not None and explore == self.evaluate:
            raise ValueError("explore is decided by mode= for server-side inference")
        try:
            action, self.weights_seq_no = self._request(obs)
        except (EpisodeLost, ConnectionError, OSError, ServerError) as exc:
            if isinstance(exc, ServerError) and not exc.retry:
                raise
            self._recover(exc)
            action, self.weights_seq_no = self.link._with_retry(lambda: self._request(obs))
        self.pending = True
        return action

    def _request(self, obs) -> tuple[object, int]:
        link = self.link
        if self.episode_id is not None and link.generation != self.generation:
            self.lost_episodes += 1  # (its connection was replaced, e.g. after METRICS found it gone)
            self.episode_id, self.reward = None, 0.0
        if self.episode_id is None:
            eid = secrets.token_hex(8)
            if isinstance(link, ServedShmLink):
                answer = link.request(OP_START, 0.0, _wire(obs), EVALUATE if self.evaluate else 0)
            else:
                answer = link.start(eid, _wire(obs), self.evaluate, self.policy)
            # (set once it started)
            self.episode_id, self.generation, self.last_obs = eid, link.generation, None
            return answer
        reward, self.reward = self.reward, 0.0
        if isinstance(link, ServedShmLink):
            return link.request(OP_STEP, reward, _wire(obs), 0)
        return link.step(self.episode_id, reward, _wire(obs))

    def _recover(self, exc: BaseException) -> None:
        """The episode in progress is gone (daemon restart, lost connection): reconnect, start over."""
        self.lost_episodes += 1
        self.episode_id, self.reward = None, 0.0
        if not isinstance(exc, EpisodeLost):
            self.link.close()

    def step(self, reward: float, next_obs, terminated: bool, truncated: bool) -> None:
        """Record the reward of the last action; an ended episode is reported at once."""
        if self.episode_id is None:
            raise RuntimeError("step() must follow act()")
        self.reward += float(reward)
        self.pending = False
        if not (terminated or truncated):
            self.last_obs = next_obs
            return
        reward, self.reward, eid, self.episode_id = self.reward, 0.0, self.episode_id, None
        self.last_obs = None
        if self.link.generation != self.generation:  # (its connection is gone: nothing to end)
            self.lost_episodes += 1
            return
        flags = (TERMINATED if terminated else 0) | (TRUNCATED if truncated else 0)
        try:
            if isinstance(self.link, ServedShmLink):
                self.link.request(OP_END, reward, _wire(next_obs), flags, wait=False)
            else:
                self.link.end(eid, reward, _wire(next_obs), bool(terminated), bool(truncated))
        except (EpisodeLost, ConnectionError, OSError, ServerError) as exc:
            if isinstance(exc, ServerError) and not exc.retry:
                raise
            self._recover(exc)

    def truncate(self) -> None:
        """End the episode in progress as truncated at its last step (its final observation
        the last ``step``'s): the next ``act`` starts an episode. For a driver that resets
        its env mid-episode; nothing when no episode is open. ValueError if an action is
        pending (step it first)."""
        if self.pending:
            raise ValueError("truncate(): an action is pending (step it first)")
        if self.episode_id is not None and self.last_obs is not None:
            self.step(0.0, self.last_obs, False, True)
        self.episode_id, self.last_obs = None, None

    def close(self) -> None:
        try:
            self.metrics.flush()
        except (ConnectionError, OSError):
            pass
        if isinstance(self.link, ServedShmLink):
            self.link.finish(CLOSE_WAIT_S)  # the last END's step still trains
        self.link.close()


def _wire(obs):
    """Observations as JSON/array values (numpy arrays pass through; lists stay lists)."""
    return obs.tolist() if isinstance(obs, np.ndarray) and obs.ndim == 0 else obs


def open_served(address: str, *, token: str | None, reconnect_timeout_s: float, ssl_context,
                evaluate: bool, policy: str | None) -> ServedAgent:
    """A ServedAgent for ``address`` (see ``served_link``)."""
    link = served_link(address, token=token, reconnect_timeout_s=reconnect_timeout_s,
                       ssl_context=ssl_context, policy=policy)
    return ServedAgent(link, evaluate=evaluate, policy=policy)


def served_link(address: str, *, token: str | None, reconnect_timeout_s: float, ssl_context,
                policy: str | None, lanes: int = 1) -> ServedTcpLink | ServedShmLink:
    """The serving link ``address`` names, not yet connected: shared-memory lanes (``lanes``
    of them) for ``shm``, ``unix://`` and ``auto`` (when a daemon runs here), as for
    client-side agents; RLlink serving messages for ``tcp://`` and ``H:P``."""
    from rlinkd.client_lib.protocol.addresses import LOCAL_KINDS, parse_endpoint
    from rlinkd.client_lib.protocol.discovery import default_state_dir
    from rlinkd.client_lib.transport import parse_address
    ep = parse_endpoint(address)
    if ep.kind in ("unix", "shm-socket"):
        return ServedShmLink(ep.path, token, reconnect_timeout_s, policy, lanes)
    if ep.kind in LOCAL_KINDS:
        socket_path = _wait_for_socket(ep, reconnect_timeout_s)
        if socket_path is not None:
            return ServedShmLink(socket_path, token, reconnect_timeout_s, policy, lanes)
        if ep.kind.startswith("shm"):
            raise ConnectionError(f"no running rlinkd found in state dir {ep.path or default_state_dir()}")
        return ServedTcpLink(parse_address("tcp://127.0.0.1:5555"), token, reconnect_timeout_s)
    return ServedTcpLink(parse_address(address), token, reconnect_timeout_s, ssl_context)


def _wait_for_socket(ep, timeout_s: float) -> str | None:
    from rlinkd.client_lib.protocol.discovery import find_socket
    deadline = time.monotonic() + min(timeout_s, 10.0)
    path = find_socket(ep)
    while path is None and time.monotonic() < deadline:
        time.sleep(0.1)
        path = find_socket(ep)
    return path
