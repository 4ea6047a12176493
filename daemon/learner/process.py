"""Learner process shell: slots in, weights out, snapshots on request.

One ``PolicyLearner`` per trainable policy, trained in turns (``shell.LearnerShell``; in a
job of several daemons in the job's rounds, ``job_shell.JobShell``). On start
each loads its part of the newest verified checkpoint (if the supervisor found one),
continues ``weights_seq_no`` from max(checkpoint, weights board) so clients see a
monotonic sequence even across learner restarts, publishes its weights, redoes
any batch a killed predecessor left in TRAINING, and then loops: the inbox is a
doorbell (BatchReady) and a control channel (SnapshotRequest, Reload, Stop);
the slot states in shared memory are the truth about pending batches.
"""
from __future__ import annotations

import time

import structlog

from rlinkd.daemon.config import Config
from rlinkd.daemon.errors import ExitCode
from rlinkd.daemon.learner.shell import LearnerShell
from rlinkd.daemon.roles import RoleContext
from rlinkd.daemon.wiring import Topology

log = structlog.get_logger("learner")
IDLE_WAIT_S = 0.25
OFF_POLICY_WAIT_S = 0.005  # an off-policy learner looks for new transitions this often


def shell_class(cfg: Config) -> type[LearnerShell]:
    """A daemon alone's shell, or a job's ([cluster] world_size > 1: only then is the job's
    shell, and torch.distributed with it, imported)."""
    if cfg.cluster.world_size > 1:
        from rlinkd.daemon.learner.job_shell import JobShell
        return JobShell
    return LearnerShell


def run(topo: Topology, ctx: RoleContext) -> ExitCode:
    """The learner's process loop."""
    shell = shell_class(topo.cfg)(topo, ctx)
    handle = shell.router()
    shell.boot()
    busy = False
    idle_wait_s = OFF_POLICY_WAIT_S if shell.off_policy else IDLE_WAIT_S
    while not ctx.stop.is_set():
        ctx.heartbeat()
        msg = ctx.inbox.recv(0 if busy else idle_wait_s)  # after a batch, only poll
        while msg is not None:
            handle(msg)
            msg = ctx.inbox.recv(0)
        busy = shell.train_one()
    for msg in ctx.inbox.drain():  # a snapshot asked for during shutdown still gets served
        handle(msg)
    log.info("learner_stopped", seq_no=shell.seq_no, at=time.time())
    return ExitCode.OK


