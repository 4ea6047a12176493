"""Learner process shell: slots in, weights out, snapshots on request.

One ``PolicyLearner`` per trainable policy, trained in turns (``LearnerShell``). On start
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

from rlinkd.daemon import messages as m
from rlinkd.client_lib.protocol.agents import DEFAULT_POLICY
from rlinkd.daemon.config import Config, ConfigValue
from rlinkd.daemon.errors import ExitCode
from rlinkd.daemon.frozen import load_frozen
from rlinkd.daemon.learner.policy_learner import PolicyLearner
from rlinkd.daemon.learner.replay_learner import ReplayLearner
from rlinkd.daemon.log import reload_level
from rlinkd.daemon.roles import RoleContext
from rlinkd.daemon.wiring import PolicyTopology, Topology
from rlinkd.shm.board import WeightsBoard

log = structlog.get_logger("learner")
IDLE_WAIT_S = 0.25
OFF_POLICY_WAIT_S = 0.005  # an off-policy learner looks for new transitions this often


class LearnerShell:
    """Every trainable policy's ``PolicyLearner``, trained in turns by one loop.

    Fairness: ``train_one`` trains one batch per call and starts its search for a ready
    batch at the policy after the one it trained last (round robin by batch), so a policy
    that always has data cannot starve another; control messages are served between
    batches.
    """

    def __init__(self, topo: Topology, ctx: RoleContext) -> None:
        self.topo, self.ctx = topo, ctx
        self.policies: dict[str, PolicyLearner | ReplayLearner] = {
            p.name: _learner_class(p, topo.cfg)(p, topo.cfg, ctx) for p in topo.trainable()}
        self._turn = 0

    @property
    def off_policy(self) -> bool:
        """Some policy trains while clients sample: the loop only polls its inbox."""
        return any(isinstance(p, ReplayLearner) for p in self.policies.values())

    @property
    def default(self) -> PolicyLearner | ReplayLearner:
        """The default policy's learner (tests, the LearnerReady report)."""
        return self.policies[DEFAULT_POLICY]

    @property
    def seq_no(self) -> int:
        return self.default.seq_no if DEFAULT_POLICY in self.policies else -1

    def boot(self) -> None:
        """Boot every policy, publish the frozen ones, tell the supervisor, redo orphaned
        batches."""
        for learner in self.policies.values():
            learner.boot(self.topo.resume_checkpoint)
        for policy in self.topo.policies.values():
            if not policy.trainable:
                self._publish_frozen(policy)
        resumed = next((p.resumed_from for p in self.policies.values() if p.resumed_from), "")
        self.ctx.send("supervisor", m.LearnerReady(self.seq_no, resumed))
        for learner in self.policies.values():
            learner.redo_orphans()

    def _publish_frozen(self, policy: PolicyTopology) -> None:
        """A frozen policy's weights onto its board, as version 0, once (a restarted learner
        finds them there). A model trained elsewhere has no board weights: the collector
        serves its file."""
        board = WeightsBoard.attach(policy.board_path)
        try:
            if board.latest_seq_no() < 0:
                weights = load_frozen(policy.definition)
                if weights.flat is not None:
                    board.publish(0, weights.flat)
                log.info("frozen_policy_loaded", policy=policy.name,
                         source=policy.definition.load_from, on_board=weights.flat is not None)
        finally:
            board.close()
        state = m.LearnerState(lr=0.0, ent_coef=0.0, updates=0, trained_steps=0, rejected_batches=0)
        self.ctx.send("collector", m.WeightsPublished(0, -1, state, None, policy.name))

    def train_one(self) -> bool:
        """Train the oldest ready batch of the next policy in turn that has one; True if one
        was trained. One per call, so the loop serves control messages (snapshots for
        checkpoints) between batches even when the connector always has the next ready."""
        if self.ctx.stop.is_set():
            return False
        order = list(self.policies.values())
        for i in range(len(order)):
            learner = order[(self._turn + i) % len(order)]
            if learner.train_ready():
                self._turn = (self._turn + i + 1) % len(order)
                return True
        return False

    def on_snapshot_request(self, msg: m.SnapshotRequest) -> None:
        generations, seq_nos = {}, {p.name: p.seq_no for p in self.policies.values()}
        try:
            for learner in self.policies.values():
                generations[learner.name] = learner.write_snapshot()
            reply = m.SnapshotReady(msg.request_id, generations, seq_nos, True, "")
        except (ValueError, OSError) as exc:
            reply = m.SnapshotReady(msg.request_id, {}, seq_nos, False, str(exc))
        self.ctx.send("checkpointer", reply)

    def on_reload(self, msg: m.Reload) -> None:
        reload_level(msg.changes, "learner")
        for learner in self.policies.values():
            section = learner.algorithm if isinstance(learner, ReplayLearner) else "ppo"
            lr = _float_or_none(msg.changes.get(f"{section}.lr"))
            ent = _float_or_none(msg.changes.get("ppo.ent_coef"))
            if lr is not None or ent is not None:
                learner.set_hparams(lr, ent)
                log.info("hparams_reloaded", policy=learner.name, lr=lr, ent_coef=ent)

    def router(self) -> m.Router:
        """BatchReady is only a doorbell (it ends the inbox wait); slot states are the truth."""
        return m.Router("learner", {m.SnapshotRequest: self.on_snapshot_request,
                                    m.Reload: self.on_reload,
                                    m.Stop: lambda _msg: self.ctx.stop.set()},
                        ignore=(m.BatchReady,))

    def close(self) -> None:
        for learner in self.policies.values():
            learner.close()


def _learner_class(policy: PolicyTopology, cfg: Config) -> type:
    """Replay or on-policy, alone or as one rank of a job ([cluster] world_size > 1: only
    then is the job's shell, and torch.distributed with it, imported)."""
    if policy.uses_replay and cfg.cluster.world_size > 1:
        from rlinkd.daemon.learner.job_replay_learner import JobReplayLearner
        return JobReplayLearner
    if policy.uses_replay:
        return ReplayLearner
    if cfg.cluster.world_size > 1:
        from rlinkd.daemon.learner.job_learner import JobLearner
        return JobLearner
    return PolicyLearner


def run(topo: Topology, ctx: RoleContext) -> ExitCode:
    """The learner's process loop."""
    shell = LearnerShell(topo, ctx)
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


def _float_or_none(value: ConfigValue | None) -> float | None:
    """A reloaded number (its type was checked when the Reload was built) as a float."""
    return None if value is None else float(value)
