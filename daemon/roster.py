"""The daemon's roles, declared once: name, process module and start order.

Everything else is derived from ``ROSTER``: the topology's inboxes and heartbeat
slots (``ROLES``), the module ``child_main`` imports (``ROLE_MODULES``) and the order
the supervisor starts them in (the order of ``ROSTER``). Adding a role is one line here
plus its module.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RoleDecl:
    """One role: its name (inbox, heartbeat slot, log name) and the module whose
    ``run(topo, ctx) -> ExitCode`` is the role's process loop."""

    name: str
    module: str


# Start order: slowest boot first (the learner imports torch and may load a checkpoint).
ROSTER = (
    RoleDecl("learner", "rlinkd.daemon.learner.process"),
    RoleDecl("collector", "rlinkd.daemon.collector.process"),
    RoleDecl("connector", "rlinkd.daemon.connector.process"),
    RoleDecl("checkpointer", "rlinkd.daemon.checkpoint.process"),
    RoleDecl("inference", "rlinkd.daemon.inference.process"),
)
ROLES = tuple(decl.name for decl in ROSTER)
ROLE_MODULES = {decl.name: decl.module for decl in ROSTER}
START_ORDER = ROLES
