"""Inference process shell: areas from the channel, links to the collector, sleep and wake.

Loop (until Stop): serve what is pending (``InferenceServer.serve_once``); when nothing is,
announce sleep in every lane area, fence, look once more, then sleep on the request
doorbell, the area channel, the links' sockets and the inbox (at most IDLE_S, for the
heartbeat). Lane areas of shared-memory clients arrive over the area channel (fds); the
collector's TCP lane areas are files in the topology. On start the role says "hello" on the
channel so a collector that outlived a previous inference process sends its areas again.
Every trainable policy has a ``PolicyLink`` (reconnected with backoff when the collector
restarts). Connections handed over after SERVE_DIRECT come over the channel too; the role
reads and answers them itself (``direct``: one private lane area per policy), polling them
while it spins and sleeping on them with the rest. Stats go to the collector every
``daemon.status_interval_s``.
"""
from __future__ import annotations

import math
import os
import select
import socket
import time

import structlog

from rlinkd.client_lib.protocol import codec
from rlinkd.client_lib.transport import SHUTTING_DOWN, RLlinkError
from rlinkd.daemon import messages as m
from rlinkd.daemon.config import NATIVE_PARTS
from rlinkd.daemon.errors import ExitCode
from rlinkd.daemon.serving import channel
from rlinkd.daemon.inference.backend import PolicyRunner
from rlinkd.daemon.inference.direct import DirectConnections
from rlinkd.daemon.inference.front import Front, LanePool
from rlinkd.daemon.inference.episodes import SlotPool
from rlinkd.daemon.inference.link import PolicyLink
from rlinkd.daemon.inference.policy_serving import HISTOGRAM_BOUNDS, PolicyServing
from rlinkd.daemon.inference.server import InferenceServer, ServedArea
from rlinkd.daemon.log import reload_level
from rlinkd.daemon.roles import RoleContext
from rlinkd.daemon.wiring import PolicyTopology, Topology, tcp_lane_capacity
from rlinkd.shm._sync import store_load_fence
from rlinkd.shm.board import WeightsBoard
from rlinkd.shm.doorbell import Doorbell
from rlinkd.shm.errors import ShmError
from rlinkd.shm.lanes import LaneArea, LaneLayout

log = structlog.get_logger("inference")
IDLE_S = 0.1
SPIN_MAX_S = 400e-6  # the spin window's cap for a few requests a turn ...
SPIN_BUSY_MAX_S = 2e-3  # ... and for many: SPIN_PER_REQUEST_S per request a turn (EWMA), up to this
SPIN_PER_REQUEST_S = 40e-6
SPIN_MIN_S = 100e-6
GAP_EWMA = 0.1
BUSY_RETRY_S = 0.002
EVAL_FLUSH_S = 0.5
RECONNECT_S = (0.05, 2.0)
DIRECT_AREA_BASE = 1 << 29  # area ids of the role's own areas for direct connections
EXPIRE_S = 1.0


class Inference:
    """The role's state: the serving core plus the shell's descriptors."""

    def __init__(self, topo: Topology, ctx: RoleContext) -> None:
        self.topo, self.ctx, cfg = topo, ctx, topo.cfg
        self.started_at = time.time()
        self.server = InferenceServer({name: self._policy(p) for name, p in topo.policies.items()},
                                      cfg.inference.max_batch, cfg.inference.max_wait_us * 1e-6,
                                      cfg.sampling.force_on_policy, cfg.inference.native_parts)
        self.request_bell = Doorbell(os.dup(topo.request_doorbell.fd))
        self.channel = socket.socket(fileno=os.dup(topo.area_channel[1].fd))
        self.channel.setblocking(False)
        self.next_connect = {name: 0.0 for name in self.server.policies}
        self.backoff = {name: RECONNECT_S[0] for name in self.server.policies}
        self.next_stats = self.next_eval = 0.0
        self.last_answer = 0.0
        self.gap_s = SPIN_MAX_S  # EWMA of the idle time from an answer to the next answering turn
        self.per_turn = 1.0      # EWMA of the requests an answering turn answers
        self.next_expire = 0.0
        self.direct = self._direct()
        self.server.while_gathering = self._read_direct  # (direct requests join a batch being gathered)

    def _policy(self, p: PolicyTopology) -> PolicyServing:
        cfg = self.topo.cfg
        runner = PolicyRunner(p.name, p.spec, p.obs_space, p.act_space,
                              WeightsBoard.attach(p.board_path), cfg.inference.backend,
                              native="net" in cfg.inference.native_parts)
        link = (PolicyLink(str(cfg.socket_path), self.topo.internal_token, p.name, p.layout)
                if p.trainable else None)
        steps = cfg.inference.env_steps_per_sample or cfg.sampling.train_batch_size
        return PolicyServing(runner, p.obs_space, SlotPool(), link, steps, off_policy=p.off_policy)

    def _direct(self) -> DirectConnections:
        """One private lane area per policy for direct connections, served like the others."""
        cfg, pools = self.topo.cfg, {}
        for i, p in enumerate(self.topo.policies.values()):
            layout = LaneLayout(p.layout)
            area = LaneArea.create_sealed(f"{self.topo.shm_prefix}.direct-{i}-{os.getpid()}", layout,
                                          tcp_lane_capacity(cfg.inference.tcp_lanes, layout))
            area.set_pid("writer", os.getpid())
            area.set_pid("reader", os.getpid())
            assert area.segment.fd is not None
            bell = Doorbell(os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC))  # (never rung: the
            self.server.add(ServedArea(DIRECT_AREA_BASE + i, area, p.name, bell),  # role waits
                            area.segment.fd)                                       # on itself)
            pools[p.name] = LanePool(area, p.obs_space, p.act_space, p.name)
        front = Front(pools, self.topo.mapping.policy_for, cfg.server.max_agents_per_connection,
                      "inference.tcp_lanes")
        return DirectConnections(front, cfg.server.max_connections, cfg.server.max_message_bytes,
                                 cfg.server.idle_timeout_s, cfg.server.read_timeout_s,
                                 native="direct" in cfg.inference.native_parts)

    # ------------------------------------------------------------ the loop
    def step(self) -> None:
        self._connect_links()
        self._release_holds()
        self._read_channel()
        self._read_direct()
        started = time.perf_counter()
        answered = self.server.serve_once()
        if self.direct.answering:
            self.direct.answer()
        self._periodic()
        if answered:  # (the gap excludes serving: a big batch is no reason to stop spinning)
            self.gap_s += GAP_EWMA * (min(started - self.last_answer, 3 * self.spin_cap_s()) - self.gap_s)
            self.per_turn += GAP_EWMA * (answered - self.per_turn)
            self.last_answer = time.perf_counter()
        self.server.publish.flush_links(only_old=True)  # (queued step records go once COALESCE_S old)
        if not answered and not self._spin() and not self._fresh():
            busy = self.server.arrivals() > 0  # (requests it cannot answer yet: retry soon)
            timeout = BUSY_RETRY_S if busy else IDLE_S
            due = self.server.publish.flush_due_in_s()  # (queued step records: at most 2 ms, so a
            if due is not None:                 # lone client wakes the collector every 2 ms,
                timeout = min(timeout, due)     # not after every step)
            self._sleep(min(timeout, self._reconnect_due_s()))

    def _read_direct(self) -> None:
        self.direct.service(self.direct.poll())

    def _fresh(self) -> bool:
        """New requests in a lane (a full scan), or something on a direct connection."""
        return bool(self.server.fresh_arrivals() or self.direct.has_work
                    or (self.direct.conns and self.direct.epoll.poll(0)))

    def _reconnect_due_s(self) -> float:
        """Seconds until a lost link's next connection attempt (inf: every link is up): a
        policy without its link holds its training requests, and nothing else would wake
        the role for the attempt."""
        due = [t for name, t in self.next_connect.items()
               if (link := self.server.policies[name].link) is not None and not link.connected]
        return max(0.0, min(due) - time.monotonic()) if due else math.inf

    def _spin(self) -> bool:
        """After answering, poll for new requests instead of sleeping for about twice the
        recent idle gap before requests (at least SPIN_MIN_S, at most ``spin_cap_s``; never
        when requests are rarer): a busy client's next request then finds the role awake, no
        wake-up on either side."""
        cap = self.spin_cap_s()
        if self.gap_s > cap:
            return False
        until = self.last_answer + min(max(2.0 * self.gap_s, SPIN_MIN_S), cap)
        while time.perf_counter() < until:
            if self.server.published_since() or self.direct.has_work or (
                    self.direct.conns and self.direct.epoll.poll(0)):
                return True
            os.sched_yield()  # (a client preempted on this core goes on meanwhile)
        return False

    def spin_cap_s(self) -> float:
        """The longest spin: SPIN_MAX_S while turns answer a few requests; with many clients
        (many requests a turn) up to SPIN_BUSY_MAX_S, SPIN_PER_REQUEST_S per request a turn.
        With 64 lone TCP clients each sleeping role wake-up cost their sends ~5 us (measured:
        a 2 ms cap took them from ~22,000 to ~25,000-32,000 actions/s); a light load (a turn
        of a request or two, e.g. 16 agents at 100 Hz) keeps the short cap, so the role
        sleeps between requests instead of spinning a core."""
        return min(SPIN_BUSY_MAX_S, max(SPIN_MAX_S, SPIN_PER_REQUEST_S * self.per_turn))

    def _sleep(self, timeout_s: float) -> None:
        """Announce sleep in every area, fence, look for new requests once more (one
        published before the announcement rang no bell), then sleep on every descriptor
        for at most ``timeout_s``."""
        self.server.announce_sleep(True)
        store_load_fence()
        if self._fresh():
            timeout_s = 0.0
        fds = [self.request_bell.fileno(), self.channel.fileno(), self.ctx.inbox.fileno(),
               self.direct.fileno()]
        fds += [p.link.fileno() for p in self.server.policies.values() if p.link and p.link.connected
                and p.link.held]
        poller = select.poll()  # (not select: descriptors may be numbered past 1023)
        for fd in fds:
            poller.register(fd, select.POLLIN)
        poller.poll(None if math.isinf(timeout_s) else math.ceil(timeout_s * 1000))
        self.request_bell.drain()
        self.server.announce_sleep(False)

    def _release_holds(self) -> None:
        for name, policy in self.server.policies.items():
            link = policy.link
            if link is None or not link.connected:
                continue
            try:
                if link.poll_release():  # (a DQN policy's epsilon comes with WEIGHTS_READY)
                    policy.runner.epsilon = codec.epsilon_of(link.exploration, name)
            except (ConnectionError, OSError, RLlinkError) as exc:  # (ERROR: shutting down)
                self._lost(name, link, exc)

    def _connect_links(self) -> None:
        now = time.monotonic()
        for name, policy in self.server.policies.items():
            link = policy.link
            if link is None or link.connected or now < self.next_connect[name]:
                continue
            try:
                link.connect()
                self.server.link_connected(name)
                self.backoff[name] = RECONNECT_S[0]
                log.info("inference_link_connected", policy=name)
            except (ConnectionError, OSError, ShmError, RLlinkError) as exc:  # the collector is
                self.next_connect[name] = now + self.backoff[name]         # (re)starting: retry
                self.backoff[name] = min(self.backoff[name] * 2, RECONNECT_S[1])
                log.debug("inference_link_retry", policy=name, error=str(exc))

    def _lost(self, name: str, link: PolicyLink, exc: BaseException) -> None:
        log.info("inference_link_lost", policy=name, error=str(exc))
        link.close()
        self.next_connect[name] = time.monotonic() + RECONNECT_S[0]

    def _read_channel(self) -> None:
        while (msg := channel.receive(self.channel)) is not None:
            if msg.op == "open":
                self._open_area(msg)
            elif msg.op == "direct" and msg.fds:
                self._add_direct(msg)
            elif msg.op == "close":
                self.server.remove(msg.area_id)
            elif msg.op == "reset":
                for area_id in [i for i in self.server.areas if i < DIRECT_AREA_BASE]:
                    self.server.remove(area_id)  # (direct connections' episodes live on)

    def _add_direct(self, msg: channel.ChannelMessage) -> None:
        """A serving connection from the collector: its socket, and the bytes already read."""
        sock_fd, *rest = msg.fds
        for extra in rest[1:]:
            os.close(extra)
        try:
            prefix = channel.read_prefix(rest[0]) if rest else b""
        except OSError as exc:
            os.close(sock_fd)
            log.warning("serving_connection_lost_in_hand_over", error=str(exc))
            return
        self.direct.add(sock_fd, prefix, msg.ready)

    def _open_area(self, msg: channel.ChannelMessage) -> None:
        """Serve a shared-memory client's area. An area this role serves already is not
        opened again: the collector announces every area when a role says hello, and an
        "open" it sent before (still in the channel) may arrive first; opening it again
        would truncate its client's episodes."""
        area_fd, bell_fd = msg.fds
        p = self.topo.policies.get(msg.policy)
        if p is None or msg.area_id in self.server.areas:
            os.close(area_fd)
            os.close(bell_fd)
            return
        keep = os.dup(area_fd)  # (from_fd closes its descriptor; the region maps this one)
        try:
            area = LaneArea.from_fd(area_fd, msg.name, LaneLayout(p.layout))
        except (ShmError, OSError) as exc:  # (its client scribbled over the header first)
            os.close(keep)
            os.close(bell_fd)
            return self._refuse(msg, exc)
        served = ServedArea(msg.area_id, area, p.name, Doorbell(bell_fd))
        try:
            area.set_pid("reader", os.getpid())
            self.server.add(served, keep)
        except (ShmError, OSError) as exc:  # (the region is full, or refused the mapping)
            served.close()
            self._refuse(msg, exc)
        finally:
            os.close(keep)

    def _refuse(self, msg: channel.ChannelMessage, exc: BaseException) -> None:
        """An area the role cannot serve: the collector closes that client's connection."""
        log.warning("inference_area_refused", area=msg.name, error=str(exc))
        try:
            channel.send(self.channel, channel.ChannelMessage("refuse", msg.area_id))
        except BlockingIOError:
            log.warning("inference_refuse_not_sent", area=msg.name)

    def _periodic(self) -> None:
        now = time.monotonic()
        if now >= self.next_expire:
            self.next_expire = now + EXPIRE_S
            self.direct.expire(now)
        if now >= self.next_eval:
            self.next_eval = now + EVAL_FLUSH_S
            try:
                self.server.publish.flush_eval()
            except (ConnectionError, OSError) as exc:
                log.info("inference_eval_not_sent", error=str(exc))
        if now >= self.next_stats:
            self.next_stats = now + self.topo.cfg.daemon.status_interval_s
            self.ctx.try_send("collector", self.stats())

    def stats(self) -> m.InferenceStats:
        s, pols = self.server.stats, self.server.policies
        times = os.times()
        return m.InferenceStats(
            requests=s.requests, actions=s.actions, batches=s.batches, errors=s.errors,
            lanes_open=self.server.open_lanes(), areas=len(self.server.areas),
            held=tuple(n for n, p in pols.items() if p.held),
            batch_sizes={f"<={b}": c for b, c in zip(HISTOGRAM_BOUNDS, s.histogram) if c},
            backends={n: p.runner.backend for n, p in pols.items() if p.runner.backend},
            cpu_s=times.user + times.system,
            weights_seq_nos={n: p.runner.weights_seq_no for n, p in pols.items()},
            direct=self.direct.report(), lanes_free=self.direct.lanes_free(),
            errors_by_kind=dict(self.direct.errors_by_kind), started_at=self.started_at,
            native_parts=self.native_parts())

    def native_parts(self) -> tuple[str, ...]:
        """The native parts serving now (status ``inference.native_parts``), in NATIVE_PARTS order."""
        used = self.server.native_in_use() | ({"direct"} if self.direct.fast is not None else set())
        return tuple(part for part in NATIVE_PARTS if part in used)

    def hello(self) -> None:
        try:
            channel.send(self.channel, channel.ChannelMessage("hello"))
        except BlockingIOError:
            log.warning("inference_hello_not_sent")

    def close(self, goodbye: str = "") -> None:
        """Close everything; ``goodbye``: the ERROR every serving connection gets first."""
        self.direct.close_all(goodbye)  # (their episodes' releases are answered by the close below)
        self.server.close()  # (ends every area's fragments: their records are queued ...)
        self.server.publish.flush_links()  # (... and written before the links close)
        for policy in self.server.policies.values():
            if policy.link is not None:
                policy.link.close()
            policy.runner.board.close()
        self.channel.close()
        self.request_bell.close()


def run(topo: Topology, ctx: RoleContext) -> ExitCode:
    """The inference role's process loop."""
    inf = Inference(topo, ctx)
    reason = ["stopped"]  # (the Stop's, for the serving connections' goodbye)

    def stop(msg: m.Stop) -> None:
        reason[0] = msg.reason
        ctx.stop.set()

    handle = m.Router("inference", {m.Stop: stop,
                                    m.Reload: lambda msg: reload_level(msg.changes, "inference")})
    inf.hello()
    log.info("inference_ready", max_batch=topo.cfg.inference.max_batch,
             max_wait_us=topo.cfg.inference.max_wait_us)
    try:
        while not ctx.stop.is_set():
            ctx.heartbeat()
            inf.step()
            for msg in ctx.inbox.drain():
                handle(msg)
    except BaseException:
        inf.close()
        raise
    inf.close(goodbye=f"{SHUTTING_DOWN}: {reason[0]}")
    return ExitCode.OK
