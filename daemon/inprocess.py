"""All roles as threads of one process, on the very same wiring (debugging and tests).

``rlinkd serve --in-process`` and the in-process tests use it: the topology is built
by ``build_topology`` exactly as for the real daemon, each role's ``run`` runs in a
thread with its own ``RoleContext``, and the supervisor inbox is read here. There is
no restart logic and no signal handling: this is for stepping through the data path
in one debugger, not for production.
"""
from __future__ import annotations

import threading
import time

import structlog

from rlinkd.daemon import messages as m
from rlinkd.daemon.config import Config
from rlinkd.daemon.roles import RoleContext, run_role
from rlinkd.daemon.roster import ROLES
from rlinkd.daemon.wiring import Topology, build_topology, destroy_topology

log = structlog.get_logger("inprocess")


class InProcessDaemon:
    """Start with ``start()``, stop with ``stop()`` (or use as a context manager)."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.topo: Topology = build_topology(cfg)
        self.contexts = {role: RoleContext(role, self.topo, in_process=True) for role in ROLES}
        self.threads: dict[str, threading.Thread] = {}
        self.exit_codes: dict[str, int] = {}
        self.listening: m.Listening | None = None
        self.messages: list = []

    def start(self, timeout_s: float = 60.0) -> InProcessDaemon:
        self.cfg.runtime_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        for role in ROLES:
            thread = threading.Thread(target=self._run, args=(role,), name=f"rlinkd-{role}",
                                      daemon=True)
            self.threads[role] = thread
            thread.start()
        self.wait_for(lambda msg: isinstance(msg, m.LearnerReady), timeout_s)
        if self.listening is None:
            self.wait_for(lambda msg: isinstance(msg, m.Listening), timeout_s)
        return self

    def _run(self, role: str) -> None:
        self.exit_codes[role] = run_role(role, self.topo, self.contexts[role])

    def wait_for(self, predicate, timeout_s: float):
        """Read the supervisor inbox until a message matches; returns it."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            msg = self.topo.inboxes["supervisor"].recv(0.05)
            if msg is None:
                continue
            self.messages.append(msg)
            if isinstance(msg, m.Listening):
                self.listening = msg
            if predicate(msg):
                return msg
        raise TimeoutError("in-process daemon: expected message did not arrive")

    def checkpoint(self, timeout_s: float = 30.0) -> m.CheckpointDone:
        """Write a checkpoint through checkpointer and learner, as SIGUSR1 would."""
        self.topo.inboxes["checkpointer"].send(m.CheckpointRequest(1, "request"))
        return self.wait_for(lambda msg: isinstance(msg, m.CheckpointDone), timeout_s)

    def stop(self, timeout_s: float = 30.0) -> dict[str, int]:
        self.topo.inboxes["collector"].send(m.Drain("stop"))
        for ctx in self.contexts.values():
            ctx.stop.set()
        for thread in self.threads.values():
            thread.join(timeout_s)
        destroy_topology(self.topo)
        return self.exit_codes

    def __enter__(self) -> InProcessDaemon:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
