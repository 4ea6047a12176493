"""The daemon's status report, assembled in the collector (the process clients talk to).

Sources: the collector's own counters, the learner's last ``WeightsPublished`` stats,
the connector's ``ConnectorStats`` and the supervisor's ``DaemonInfo`` (children,
restarts, last checkpoint). ``rlinkd status`` prints this dict; the supervisor gets it
every ``status_interval_s`` for checkpoints and systemd STATUS= lines.
"""
from __future__ import annotations

import time
from collections import deque

from rlinkd.daemon import messages as m
from rlinkd.daemon.collector.core import CollectorCore
from rlinkd.daemon.wiring import Topology


class StatusBuilder:
    """Keeps the latest reports from the other roles; ``build()`` is cheap (called often)."""

    def __init__(self, topo: Topology, core: CollectorCore) -> None:
        self.topo, self.core = topo, core
        self.server = None  # set by the process shell (for the port and waiting clients)
        self.learner: m.LearnerState | None = None
        self.update: m.TrainStats | None = None
        self.trained_seq_no = -1
        self.connector: dict = {}
        self.daemon: dict = {}
        self.rate_window: deque = deque(maxlen=64)

    def on_learner(self, msg: m.WeightsPublished) -> None:
        """Every WeightsPublished carries the live hyperparameters (also after a reload);
        only a trained one replaces the last update's stats."""
        self.learner = msg.learner
        if msg.update is not None:
            self.update, self.trained_seq_no = msg.update, msg.seq_no

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
                          "trained_steps": msg.trained_steps}

    def on_daemon_info(self, msg: m.DaemonInfo) -> None:
        self.daemon = m.daemon_report(msg)

    def steps_per_s(self) -> float:
        """Ingested env steps per second over the last ~10 s."""
        now = time.monotonic()
        self.rate_window.append((now, self.core.env_steps))
        while len(self.rate_window) > 2 and now - self.rate_window[0][0] > 10.0:
            self.rate_window.popleft()
        (t0, s0), (t1, s1) = self.rate_window[0], self.rate_window[-1]
        return round((s1 - s0) / (t1 - t0), 1) if t1 > t0 else 0.0

    def summary(self) -> m.CollectorStatus:
        """What the supervisor gets every ``status_interval_s`` (TensorBoard, systemd)."""
        return _summary_of(self.build(), self.learner, self.update)

    def build(self) -> dict:
        core, stats = self.core, self.core.stats
        weights = self.server.weights if self.server else None
        return {
            "env_steps": core.env_steps,
            "episodes": stats.episodes,
            "episode_return_mean": _round(stats.mean_return(100)),
            "episode_return_mean_20": _round(stats.mean_return(20)),
            "episode_len_mean": _round(stats.mean_length()),
            "weights_seq_no": weights.seq_no if weights else -1,
            "clients": len(core.samplers()),
            "connections": len(core.sessions),
            "waiting_clients": sum(1 for s in core.samplers() if s.waiting_cutoff is not None),
            "dropped_episodes": self.connector.get("dropped_episodes", 0),
            "protocol_errors": core.protocol_errors,
            "uptime_s": round(time.time() - self.topo.started_at, 1),
            "env_steps_per_s": self.steps_per_s(),
            "host": self.topo.cfg.server.host,
            "port": self.server.port if self.server else 0,
            "unix_socket": str(self.topo.cfg.socket_path),
            "sessions": [{"id": s.id, "transport": s.transport, "peer": s.peer, "shm": s.is_shm,
                          "env_steps": s.env_steps} for s in core.samplers()],
            "learner": self.learner_section(),
            "connector": self.connector,
            **self.daemon,
        }


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
