"""Collector process shell: build the core, run the event loop, talk to the other roles.

``run(topo, ctx)`` attaches the episode ring (as its only producer) and the weights
board, starts the listeners, reports ``Listening`` to the supervisor, then loops
until ``Drain``/``Stop`` (or its stop flag, in-process): inbox messages are handled on the event loop,
a periodic tick heart-beats, forces overdue on-policy batches and reports status.
"""
from __future__ import annotations

import asyncio
import os
import time

import structlog

from rlinkd.client_lib.protocol.netops import network_json
from rlinkd.daemon import messages as m
from rlinkd.daemon.collector.pacing import Pacer, pace_limit
from rlinkd.daemon.collector.core import CollectorCore, policy_info
from rlinkd.daemon.collector.server import CollectorServer, EpisodeRoute
from rlinkd.daemon.collector.serving import ServingFront
from rlinkd.daemon.collector.shm_clients import ShmClients
from rlinkd.daemon.collector.shm_server import ShmIngestor
from rlinkd.daemon.collector.status import StatusBuilder
from rlinkd.client_lib.protocol.agents import DEFAULT_POLICY
from rlinkd.daemon.collector.rllib_msgpack import RllibFlavour
from rlinkd.daemon.collector.weights import StaticWeights, WeightsCache
from rlinkd.daemon.frozen import foreign_onnx
from rlinkd.daemon.errors import ExitCode
from rlinkd.daemon.log import reload_level
from rlinkd.daemon.roles import RoleContext
from rlinkd.daemon.tls import server_context
from rlinkd.daemon.wiring import PolicyTopology, Topology
from rlinkd.shm.board import WeightsBoard
from rlinkd.shm.doorbell import Doorbell
from rlinkd.shm.ring import StepRing

log = structlog.get_logger("collector")
TICK_S = 0.05


class CollectorProcess:
    """Glue between the server, the inbox and the periodic tick.

    Assembled in dependency order, everything through constructors: episode ring and
    weights board (shared memory) → core → weights cache → status (core, weights) →
    server (core, ring, weights, status, and a factory that builds its ``ShmIngestor``
    from the server itself, which creates the doorbell FIFO). Nothing is set afterwards.
    """

    def __init__(self, topo: Topology, ctx: RoleContext) -> None:
        self.topo, self.ctx = topo, ctx
        doorbell = Doorbell.from_fd(topo.episode_doorbell.fd)
        space_doorbell = Doorbell.from_fd(topo.episode_space_doorbell.fd)
        self.routes = {p.name: EpisodeRoute(StepRing.attach(
            p.episode_ring_path, expected_layout=p.layout, doorbell=doorbell,
            space_doorbell=space_doorbell)) for p in topo.trainable()}
        self.boards = {name: WeightsBoard.attach(p.board_path) for name, p in topo.policies.items()}
        self.policies = {name: policy_info(p.definition) for name, p in topo.policies.items()}
        core = CollectorCore(topo.cfg, self.policies, topo.read_counters(),
                             internal_token=topo.internal_token)
        weights = {name: weights_cache(p, self.boards[name]) for name, p in topo.policies.items()}
        serving = ServingFront(topo)
        pacer = Pacer({n: pace_limit(p) for n, p in topo.policies.items()},
                      topo.cfg.sampling.max_wait_for_batch_s, lambda policy: core.policy_steps.get(policy, 0))
        self.status = StatusBuilder(topo, core, weights, routes=self.routes, serving_status=serving.status,
                                    pacing_status=pacer.report)
        self.server = CollectorServer(core, self.routes, weights, self.status,
                                      make_shm=self._make_shm_ingestor,
                                      ssl_ctx=server_context(topo.cfg.server),
                                      on_ingest=lambda: topo.write_counters(core.counters()),
                                      serving=serving, pacer=pacer,
                                      rllib=RllibFlavour(core, topo.policies[DEFAULT_POLICY].definition,
                                                         weights[DEFAULT_POLICY]))
        self.done = asyncio.Event()
        self.route = m.Router("collector", {
            m.WeightsPublished: self._on_weights, m.ConnectorStats: self.status.on_connector,
            m.DaemonInfo: self.status.on_daemon_info, m.Drain: self._on_drain,
            m.Stop: self._on_drain, m.Reload: self._on_reload,
            m.ConnectorLag: lambda msg: self.server.pacer.on_report(msg.policy, msg.lag_steps),
            m.InferenceStats: self.status.on_inference})
        self.drain_started = False

    def _make_shm_ingestor(self, server: CollectorServer) -> ShmIngestor:
        """Called once, by ``CollectorServer.__init__``."""
        topo = self.topo
        clients = ShmClients(topo.shm_prefix, self.policies, topo.cfg.server.max_agents_per_connection,
                             server.core.new_stream_id)
        return ShmIngestor(server, clients, topo.cfg.runtime_dir / "doorbell.fifo",
                           attached_info(topo))

    async def main(self) -> None:
        await self.server.start()
        self.server.shm.start()
        assert self.server.serving is not None
        self.server.serving.start()
        self.ctx.send("supervisor", m.Listening(self.topo.cfg.server.host, self.server.port,
                                                str(self.topo.cfg.socket_path)))
        log.info("listening", host=self.topo.cfg.server.host, port=self.server.port,
                 unix_socket=str(self.topo.cfg.socket_path))
        loop = asyncio.get_running_loop()
        loop.add_reader(self.ctx.inbox.fileno(), self._on_inbox)
        self.server.refresh_weights()
        tick = asyncio.ensure_future(self._tick())
        failed = asyncio.ensure_future(self.server.background.failed.wait())
        await asyncio.wait([asyncio.ensure_future(self.done.wait()), failed],
                           return_when=asyncio.FIRST_COMPLETED)
        if self.server.background.fatal is not None:
            raise self.server.background.fatal
        loop.remove_reader(self.ctx.inbox.fileno())
        tick.cancel()
        self.server.shm.stop()
        self.server.serving.stop()

    def _on_inbox(self) -> None:
        """Event-loop reader callback: a message that fails to decode or to dispatch ends the
        role (CRASH, restarted) instead of being dropped by asyncio's callback logging."""
        try:
            for msg in self.ctx.inbox.drain():
                self.route(msg)
        except Exception as exc:  # noqa: BLE001 - handed to the process boundary, not swallowed
            self.server.background.fail(exc)

    def _on_weights(self, msg: m.WeightsPublished) -> None:
        self.status.on_learner(msg)
        cache = self.server.weights.get(msg.policy)
        if cache is not None and msg.learner is not None:
            cache.set_exploration(msg.learner.epsilon)
            self.server.pacer.on_report(msg.policy, msg.learner.lag_steps)
        self.server.on_weights_published(msg.policy, msg.cutoff_ingest_id)

    def _on_drain(self, msg) -> None:
        if self.drain_started:  # Drain, then Stop (or the stop flag): one drain
            return
        self.drain_started = True
        log.info("draining", reason=msg.reason)
        self.server.background.spawn(self._drain_then_finish(msg.reason))

    async def _drain_then_finish(self, reason: str) -> None:
        await self.server.drain(reason)
        self._report_status()
        self.done.set()

    def _on_reload(self, msg: m.Reload) -> None:
        reload_level(msg.changes, "collector")

    async def _tick(self) -> None:
        next_status = 0.0
        while True:
            self.ctx.heartbeat()
            if self.ctx.stop.is_set():
                self._on_drain(m.Drain("stop requested"))
                return
            self.status.on_tick()
            self.server.maybe_flush()
            self.server.shm.on_doorbell()  # safety net for a lost wake-up
            self.server.shm.reap_gone()
            self.server.refresh_weights()
            now = time.monotonic()
            if now >= next_status:
                self._report_status()
                next_status = now + self.topo.cfg.daemon.status_interval_s
            await asyncio.sleep(TICK_S)

    def _report_status(self) -> None:
        self.ctx.try_send("supervisor", self.status.summary(self.server.port))


def attached_info(topo: Topology) -> dict[str, dict]:
    """The constant part of every ATTACHED reply, by policy (no board path for a frozen model
    trained elsewhere: the client fetches that model with GET_STATE)."""
    s = topo.cfg.sampling
    return {name: {"board_path": "" if foreign_onnx(p.definition) else p.board_path,
                   "layout": p.layout_json,
                   "policy_spec": p.spec.to_json(), "network": network_json(p.spec.net, p.spec.action_components),
                   "env_steps_per_sample": s.env_steps_per_sample,
                   "force_on_policy": s.force_on_policy and not p.off_policy,
                   **_state_key(p.spec.state_contract())}
            for name, p in topo.policies.items()}


def _state_key(contract: dict | None) -> dict[str, dict]:
    """ATTACHED's additive "state" key: present only for a recurrent policy."""
    return {} if contract is None else {"state": contract}


def weights_cache(policy: PolicyTopology, board: WeightsBoard) -> WeightsCache:
    """SET_STATE source of one policy: its board, or the file of a frozen model trained
    elsewhere (which has no board weights)."""
    foreign = foreign_onnx(policy.definition)
    if foreign is not None:
        return StaticWeights(board, foreign, policy.name)
    return WeightsCache(board, policy.spec, policy.name)


def event_loop_runner():
    """``uvloop.run`` when uvloop is installed (about twice asyncio's message rate: see
    BENCHMARKS.md), else ``asyncio.run``; ``RLINKD_ASYNCIO=1`` forces the latter."""
    if os.environ.get("RLINKD_ASYNCIO") != "1":
        try:
            import uvloop
            return uvloop.run
        except ImportError:
            pass
    return asyncio.run


def run(topo: Topology, ctx: RoleContext) -> ExitCode:
    """The collector's process loop; returns when drained or stopped."""
    proc = CollectorProcess(topo, ctx)
    event_loop_runner()(proc.main())
    for route in proc.routes.values():
        route.ring.close()
    for board in proc.boards.values():
        board.close()
    return ExitCode.OK


__all__ = ["CollectorProcess", "run"]
