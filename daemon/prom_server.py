"""The Prometheus endpoint's process shell: an HTTP server thread in the supervisor.

Why the supervisor: it lives as long as the daemon (a restarted collector or learner does
not take the endpoint down, and the restarts themselves are what a scrape should show), it
knows every role's pid, and it already owns the other outputs (TensorBoard, systemd).

``MetricsEndpoint.start()`` binds ``metrics.listen`` (called once by the supervisor while
preparing; a bind failure is a ``ConfigError``: exit 78) and serves ``/metrics`` with
``prometheus_client``'s threaded HTTP server. Each request runs ``collect()`` in a server
thread, never on the supervisor's loop: STATUS over the daemon's Unix socket (the report
``rlinkd status`` prints; bounded by ``STATUS_TIMEOUT_S``), CPU time and RSS of each role's
process (psutil), then ``daemon.prom.families``. When the collector does not answer, the
scrape still succeeds with ``rlinkd_collector_up 0`` and the supervisor's own part of the
report (roles, restarts, checkpoints). Scrapes run one at a time (a lock): a burst of
scrapers queues instead of multiplying the cost. The supervisor hands its latest
``DaemonInfo`` over with ``publish`` (an atomic reference swap), so a scrape never calls
into the supervisor's state. ``close()`` stops the server (supervisor cleanup).
"""
from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from wsgiref.simple_server import WSGIServer

import psutil
import structlog
from prometheus_client import start_http_server
from prometheus_client.registry import CollectorRegistry
from prometheus_client.core import Metric

from rlinkd.client_lib.protocol.codec import ProtocolError
from rlinkd.client_lib.transport import RLlinkClient, RLlinkError
from rlinkd.daemon import messages as m
from rlinkd.daemon.checkpoint.process import package_version
from rlinkd.daemon.config import Config, ConfigError, metrics_address
from rlinkd.daemon.prom import ProcessSample, Scrape, families

log = structlog.get_logger("metrics")
STATUS_TIMEOUT_S = 2.0
"""How long a scrape waits for the collector's STATUS before exporting without it."""


class MetricsEndpoint:
    """``/metrics`` of one daemon (see the module docstring). Built by the supervisor only
    when ``metrics.listen`` is set; ``url`` is known once ``start()`` has bound."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.info: m.DaemonInfo | None = None
        self.lock = threading.Lock()
        self.server: WSGIServer | None = None
        self.url = ""
        self.version = package_version()

    def start(self) -> str:
        """Bind and serve in a daemon thread; returns the URL (the real port when 0)."""
        address = metrics_address(self.cfg.metrics)
        assert address is not None, "the supervisor builds an endpoint only when listen is set"
        registry = CollectorRegistry()
        registry.register(self)
        try:
            self.server, _thread = start_http_server(address[1], address[0], registry=registry)
        except OSError as exc:
            raise ConfigError(f"metrics.listen = {self.cfg.metrics.listen!r}: cannot bind "
                              f"({exc.strerror or exc})") from None
        port = self.server.server_address[1]
        host = f"[{address[0]}]" if ":" in address[0] else address[0]
        self.url = f"http://{host}:{port}/metrics"
        log.info("metrics_listening", url=self.url)
        return self.url

    def publish(self, info: m.DaemonInfo) -> None:
        """Supervisor loop, every ``status_interval_s``: the newest roles, pids, restarts."""
        self.info = info

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    # ------------------------------------------------------------ one scrape (server thread)
    def collect(self) -> Iterable[Metric]:
        """Called by prometheus_client for every request to ``/metrics``."""
        with self.lock:
            return families(self.scrape())

    def scrape(self) -> Scrape:
        info = self.info
        report = self._collector_report()
        fallback = m.daemon_report(info) if info is not None else {}
        return Scrape(report=report if report is not None else fallback,
                      collector_up=report is not None, version=self.version,
                      processes=process_samples(info))

    def _collector_report(self) -> dict | None:
        """The STATUS report, None when the collector does not answer (down, restarting,
        hung past ``STATUS_TIMEOUT_S``)."""
        try:
            with RLlinkClient(f"unix://{self.cfg.socket_path}", STATUS_TIMEOUT_S) as client:
                return client.status(self.cfg.server.token or None)
        except (OSError, RLlinkError, ProtocolError) as exc:
            log.debug("metrics_status_unavailable", error=str(exc))
            return None


def process_samples(info: m.DaemonInfo | None) -> dict[str, ProcessSample]:
    """CPU time and RSS of the supervisor (this process) and of each live role process;
    a process that vanished since ``info`` was taken is left out."""
    pids = {"supervisor": os.getpid()}
    if info is not None:
        pids |= {role: c.pid for role, c in info.children.items() if c.alive and c.pid}
    samples = {}
    for role, pid in pids.items():
        try:
            with (proc := psutil.Process(pid)).oneshot():
                cpu = proc.cpu_times()
                samples[role] = ProcessSample(cpu.user + cpu.system, proc.memory_info().rss)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return samples

