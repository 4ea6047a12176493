"""The daemon's status report, assembled in the collector (the process clients talk to).

Sources: the collector's own counters (protocol errors by kind, message-latency
histograms), the episode ring's fill, the learner's ``WeightsPublished`` stats (the last
update's, and a histogram of update times), the connector's ``ConnectorStats`` (batch
slots by state) and the supervisor's ``DaemonInfo`` (children, restarts, last checkpoint,
the metrics URL). ``rlinkd status`` prints this dict, the Prometheus endpoint
(``daemon.prom``) exports it; the supervisor gets a digest every ``status_interval_s``
for TensorBoard and systemd STATUS= lines.
"""
from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from rlinkd.client_lib.protocol.agents import DEFAULT_POLICY
from rlinkd.daemon import messages as m
from rlinkd.daemon.collector.core import CollectorCore
from rlinkd.daemon.collector.latency import (MESSAGE_BOUNDS_S, UPDATE_BOUNDS_S, Histogram,
                                             HistogramSet)
from rlinkd.daemon.collector.weights import WeightsCache
from rlinkd.daemon.wiring import Topology
from rlinkd.shm.slots import FILLING, FREE, READY, TRAINING

SLOT_STATE_NAMES = {FREE: "free", FILLING: "filling", READY: "ready", TRAINING: "training"}

RATE_WINDOW_S = 10.0
RATE_RESOLUTION_S = 0.5


class RateMeter:
    """Events per second over the last ``window_s``, from samples of a running total.

    ``sample(now, total)`` is called on the collector's tick; a sample closer than
    ``resolution_s`` to the previous one is skipped, so the window spans ``window_s``
    whatever the call rate. ``per_s()`` only reads: asking never changes the answer.
    """

    def __init__(self, window_s: float = RATE_WINDOW_S, resolution_s: float = RATE_RESOLUTION_S) -> None:
        self.window_s, self.resolution_s = window_s, resolution_s
        self.samples: deque[tuple[float, int]] = deque(maxlen=int(window_s / resolution_s) + 2)

    def sample(self, now: float, total: int) -> None:
        if self.samples and now - self.samples[-1][0] < self.resolution_s:
            return
        self.samples.append((now, total))
        while now - self.samples[0][0] > self.window_s:
            self.samples.popleft()

    def per_s(self) -> float:
        """Average rate between the oldest and newest sample (0.0 before two samples)."""
        if len(self.samples) < 2:
            return 0.0
        (t0, n0), (t1, n1) = self.samples[0], self.samples[-1]
        return (n1 - n0) / (t1 - t0)


class StatusBuilder:
    """Keeps the latest reports from the other roles; ``build()`` is cheap (called often).

    Built by the process shell before the server (which answers STATUS with ``build``):
    ``core`` for counters and sessions, ``weights`` for the served version, ``clock``
    (monotonic seconds; injectable for tests) for the steps/s samples taken by ``on_tick``,
    ``ring`` (the episode ring, when there is one) for its fill.
    """

    def __init__(self, topo: Topology, core: CollectorCore, weights: dict[str, WeightsCache],
                 clock: Callable[[], float] = time.monotonic, routes: dict | None = None,
                 serving_status: Callable[[], dict] = dict,
                 pacing_status: Callable[[], dict] = dict) -> None:
        self.topo, self.core, self.weights, self.clock = topo, core, weights, clock
        self.serving_status = serving_status  # the collector's serving hand-overs and shm areas
        self.pacing_status = pacing_status  # samples held by pacing (``Pacer.report``)
        self.inference: dict = {}
        self.serving_errors: dict[str, int] = {}  # the role's serving connections' protocol errors
        self.role_errors_seen: dict[str, int] = {}  # ... as its last report counted them
        self.role_started_at = 0.0  # ... of the role process that sent that report
        self.routes = routes or {}  # trainable policies' episode rings (producer side): fill
        self.learners = {name: PolicyReport() for name in weights}
        self.daemon: dict = {}
        self.rate = RateMeter()
        self.message_latency = HistogramSet(MESSAGE_BOUNDS_S)  # observed by the server
        self.update_latency = Histogram(UPDATE_BOUNDS_S)

    def on_tick(self) -> None:
        """Collector tick (every ~50 ms): sample the ingested step count."""
        self.rate.sample(self.clock(), self.core.env_steps)

    @property
    def learner(self) -> m.LearnerState | None:
        return self.learners[DEFAULT_POLICY].learner

    @property
    def update(self) -> m.TrainStats | None:
        return self.learners[DEFAULT_POLICY].update

    @property
    def connector(self) -> dict:
        return self.learners[DEFAULT_POLICY].connector

    def on_learner(self, msg: m.WeightsPublished) -> None:
        """Every WeightsPublished carries the live hyperparameters (also after a reload);
        only a trained one replaces the last update's stats."""
        report = self.learners.setdefault(msg.policy, PolicyReport())
        report.learner = msg.learner
        if msg.update is not None:
            report.update, report.trained_seq_no = msg.update, msg.seq_no
            self.update_latency.observe(msg.update.update_time_s)

    def learner_section(self, policy: str = DEFAULT_POLICY) -> dict:
        """The ``learner`` section of a policy's report (empty before its learner reported)."""
        r = self.learners[policy]
        if r.learner is None:
            return {}
        report = m.learner_report(r.learner, r.update)
        return report | ({"weights_seq_no": r.trained_seq_no} if r.update else {})

    def on_connector(self, msg: m.ConnectorStats) -> None:
        self.learners.setdefault(msg.policy, PolicyReport()).connector = {
            "dropped_episodes": msg.dropped_episodes, "dropped_steps": msg.dropped_steps,
            "batches": msg.batches, "buffered_steps": msg.buffered_steps,
            "trained_steps": msg.trained_steps,
            "slots": {name: sum(1 for s in msg.slot_states if s == code)
                      for code, name in SLOT_STATE_NAMES.items()}}

    def on_inference(self, msg: m.InferenceStats) -> None:
        """The inference role's periodic report (server-side actions)."""
        self.inference = m.inference_report(msg)
        if msg.started_at != self.role_started_at:  # (a new role counts from 0 again)
            self.role_started_at, self.role_errors_seen = msg.started_at, {}
        for kind, n in msg.errors_by_kind.items():
            self.serving_errors[kind] = self.serving_errors.get(kind, 0) + n - self.role_errors_seen.get(kind, 0)
            self.role_errors_seen[kind] = n

    def _protocol_errors(self) -> dict:
        """Connections closed for bad input: the collector's and the inference role's (its
        serving connections), by kind."""
        by_kind = dict(self.core.protocol_errors_by_kind)
        for kind, n in self.serving_errors.items():
            by_kind[kind] = by_kind.get(kind, 0) + n
        return {"protocol_errors": self.core.protocol_errors + sum(self.serving_errors.values()),
                "protocol_errors_by_kind": dict(sorted(by_kind.items()))}

    def on_daemon_info(self, msg: m.DaemonInfo) -> None:
        self.daemon = m.daemon_report(msg)

    def summary(self, port: int) -> m.CollectorStatus:
        """What the supervisor gets every ``status_interval_s`` (TensorBoard, systemd)."""
        scalars = self.core.evaluation.scalars(DEFAULT_POLICY) | self.core.client_metrics.take_scalars()
        return _summary_of(self.build(port), self.learner, self.update, self.policy_digests(), scalars)

    def policy_digests(self) -> dict[str, m.PolicyDigest]:
        """Every policy but the default (whose figures are the summary's own), when the
        daemon has several."""
        if len(self.weights) == 1:
            return {}
        return {name: m.PolicyDigest(
            weights_seq_no=self.weights[name].seq_no, episodes=self.core.policy_stats[name].episodes,
            episode_return_mean=_round(self.core.policy_stats[name].mean_return(100)),
            learner=r.learner, update=r.update)
            for name, r in self.learners.items() if name != DEFAULT_POLICY and name in self.weights}

    def policies_section(self) -> dict:
        """Per policy: version, trainable, steps, episodes, returns, learner and connector;
        a recurrent policy's cell ("recurrent": cell, recurrent_size, max_seq_len)."""
        out = {}
        for name, cache in self.weights.items():
            stats = self.core.policy_stats[name]
            out[name] = {"weights_seq_no": cache.seq_no,
                         "trainable": self.core.policies[name].trainable,
                         "env_steps": self.core.policy_steps[name], "episodes": stats.episodes,
                         "episode_return_mean": _round(stats.mean_return(100)),
                         "episode_return_mean_20": _round(stats.mean_return(20)),
                         "learner": self.learner_section(name),
                         "connector": self.learners[name].connector,
                         **_memory(self.core.policies[name].state)}
        return out

    def build(self, port: int) -> dict:
        """The status dict; ``port`` is the TCP listener's (known once listening)."""
        core, stats = self.core, self.core.stats
        return {
            "env_steps": core.env_steps,
            "episodes": stats.episodes,
            "episode_return_mean": _round(stats.mean_return(100)),
            "episode_return_mean_20": _round(stats.mean_return(20)),
            "episode_len_mean": _round(stats.mean_length()),
            "weights_seq_no": self.weights[DEFAULT_POLICY].seq_no,
            "clients": len(core.samplers()),
            "connections": sum(1 for s in core.sessions.values() if not s.internal),
            "internal_connections": sum(1 for s in core.sessions.values() if s.internal),
            "waiting_clients": sum(1 for s in core.samplers() if s.is_waiting),
            **self.pacing_status(),
            "agents": core.open_agents(),
            "dropped_episodes": sum(r.connector.get("dropped_episodes", 0)
                                    for r in self.learners.values()),
            **self._protocol_errors(),
            **core.admission.report(),
            "uptime_s": round(time.time() - self.topo.started_at, 1),
            "env_steps_per_s": round(self.rate.per_s(), 1),
            "host": self.topo.cfg.server.host,
            "port": port,
            "unix_socket": str(self.topo.cfg.socket_path),
            "sessions": [{"id": s.id, "transport": s.transport, "peer": s.peer, "shm": s.is_shm,
                          "env_steps": s.env_steps} for s in core.samplers()],
            "learner": self.learner_section(),
            "connector": self.connector,
            "episode_ring": self.ring_section(),
            "policies": self.policies_section(),
            "latency": self.latency_section(),
            "inference": self.inference | self.serving_status(),
            "eval": core.evaluation.report(),
            "client_metrics": core.client_metrics.report(),
            "client_metrics_dropped": core.client_metrics.dropped,
            **self.daemon,
        }

    def ring_section(self) -> dict:
        """Records waiting in the default policy's episode ring now, and its capacity (``{}``
        without one)."""
        route = self.routes.get(DEFAULT_POLICY)
        if route is None:
            return {}
        return {"records": route.ring.capacity - route.ring.free_records(),
                "capacity": route.ring.capacity}

    def latency_section(self) -> dict:
        """Histograms since this collector started: RLlink messages by type (frame read →
        reply written, so an on-policy EPISODES_AND_GET_STATE includes its wait for
        training) and learner updates (as the learner measured them)."""
        return {"message_seconds": self.message_latency.report(),
                "learner_update_seconds": {"bounds_s": list(self.update_latency.bounds_s),
                                           **self.update_latency.report()}}


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


@dataclass
class PolicyReport:
    """The latest learner and connector reports of one policy."""

    learner: m.LearnerState | None = None
    update: m.TrainStats | None = None
    trained_seq_no: int = -1
    connector: dict = field(default_factory=dict)


def _summary_of(report: dict, learner: m.LearnerState | None, update: m.TrainStats | None,
                policies: dict[str, m.PolicyDigest] | None = None,
                scalars: dict[str, float] | None = None) -> m.CollectorStatus:
    """The supervisor's typed digest of one status report."""
    return m.CollectorStatus(
        env_steps=report["env_steps"], episodes=report["episodes"],
        env_steps_per_s=report["env_steps_per_s"],
        episode_return_mean=report["episode_return_mean"],
        episode_len_mean=report["episode_len_mean"], weights_seq_no=report["weights_seq_no"],
        clients=report["clients"], dropped_episodes=report["dropped_episodes"],
        learner=learner, update=update, policies=policies or {}, scalars=scalars or {})


def _memory(state: dict | None) -> dict:
    """A policy's "recurrent" status entry from its state contract (nothing when feed-forward)."""
    if state is None:
        return {}
    return {"recurrent": {key: state[key] for key in ("cell", "recurrent_size", "max_seq_len")}}
