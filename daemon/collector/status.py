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

from rlinkd.daemon import messages as m
from rlinkd.daemon.collector.core import CollectorCore
from rlinkd.daemon.collector.latency import (MESSAGE_BOUNDS_S, UPDATE_BOUNDS_S, Histogram,
                                             HistogramSet)
from rlinkd.daemon.collector.weights import WeightsCache
from rlinkd.daemon.wiring import Topology
from rlinkd.shm.ring import StepRing
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

    def __init__(self, topo: Topology, core: CollectorCore, weights: WeightsCache,
                 clock: Callable[[], float] = time.monotonic, ring: StepRing | None = None) -> None:
        self.topo, self.core, self.weights, self.clock = topo, core, weights, clock
        self.ring = ring  # the episode ring (producer side) whose fill is reported
        self.learner: m.LearnerState | None = None
        self.update: m.TrainStats | None = None
        self.trained_seq_no = -1
        self.connector: dict = {}
        self.daemon: dict = {}
        self.rate = RateMeter()
        self.message_latency = HistogramSet(MESSAGE_BOUNDS_S)  # observed by the server
        self.update_latency = Histogram(UPDATE_BOUNDS_S)

    def on_tick(self) -> None:
        """Collector tick (every ~50 ms): sample the ingested step count."""
        self.rate.sample(self.clock(), self.core.env_steps)

    def on_learner(self, msg: m.WeightsPublished) -> None:
        """Every WeightsPublished carries the live hyperparameters (also after a reload);
        only a trained one replaces the last update's stats."""
        self.learner = msg.learner
        if msg.update is not None:
            self.update, self.trained_seq_no = msg.update, msg.seq_no
            self.update_latency.observe(msg.update.update_time_s)

    def learner_section(self) -> dict:
        """The ``learner`` section of the report (empty before the learner reported)."""
        if self.learner is None:
            return {}
        report = m.learner_report(self.learner, self.update)
        return report | ({"weights_seq_no": self.trained_seq_no} if self.update else {})

    def on_connector(self, msg: m.ConnectorStats) -> None:
        self.connector = {"dropped_episodes": msg.dropped_episodes,
                          "dropped_steps": msg.dropped_steps, "batches": msg.batches,
                          "buffered_steps": msg.buffered_steps,
                          "trained_steps": msg.trained_steps,
                          "slots": {name: sum(1 for s in msg.slot_states if s == code)
                                    for code, name in SLOT_STATE_NAMES.items()}}

    def on_daemon_info(self, msg: m.DaemonInfo) -> None:
        self.daemon = m.daemon_report(msg)

    def summary(self, port: int) -> m.CollectorStatus:
        """What the supervisor gets every ``status_interval_s`` (TensorBoard, systemd)."""
        return _summary_of(self.build(port), self.learner, self.update)

    def build(self, port: int) -> dict:
        """The status dict; ``port`` is the TCP listener's (known once listening)."""
        core, stats = self.core, self.core.stats
        return {
            "env_steps": core.env_steps,
            "episodes": stats.episodes,
            "episode_return_mean": _round(stats.mean_return(100)),
            "episode_return_mean_20": _round(stats.mean_return(20)),
            "episode_len_mean": _round(stats.mean_length()),
            "weights_seq_no": self.weights.seq_no,
            "clients": len(core.samplers()),
            "connections": len(core.sessions),
            "waiting_clients": sum(1 for s in core.samplers() if s.waiting_cutoff is not None),
            "dropped_episodes": self.connector.get("dropped_episodes", 0),
            "protocol_errors": core.protocol_errors,
            "protocol_errors_by_kind": dict(sorted(core.protocol_errors_by_kind.items())),
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
            "latency": self.latency_section(),
            **self.daemon,
        }

    def ring_section(self) -> dict:
        """Records waiting in the episode ring now, and its capacity (``{}`` without one)."""
        if self.ring is None:
            return {}
        return {"records": self.ring.capacity - self.ring.free_records(),
                "capacity": self.ring.capacity}

    def latency_section(self) -> dict:
        """Histograms since this collector started: RLlink messages by type (frame read →
        reply written, so an on-policy EPISODES_AND_GET_STATE includes its wait for
        training) and learner updates (as the learner measured them)."""
        return {"message_seconds": self.message_latency.report(),
                "learner_update_seconds": {"bounds_s": list(self.update_latency.bounds_s),
                                           **self.update_latency.report()}}


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _summary_of(report: dict, learner: m.LearnerState | None,
                update: m.TrainStats | None) -> m.CollectorStatus:
    """The supervisor's typed digest of one status report."""
    return m.CollectorStatus(
        env_steps=report["env_steps"], episodes=report["episodes"],
        env_steps_per_s=report["env_steps_per_s"],
        episode_return_mean=report["episode_return_mean"],
        episode_len_mean=report["episode_len_mean"], weights_seq_no=report["weights_seq_no"],
        clients=report["clients"], dropped_episodes=report["dropped_episodes"],
        learner=learner, update=update)
