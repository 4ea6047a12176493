"""The learner process's policies, trained in turns: ``LearnerShell`` (``process`` runs its
loop; a job of several daemons uses ``job_shell.JobShell``)."""
from __future__ import annotations

import structlog

from rlinkd.daemon import messages as m
from rlinkd.client_lib.protocol.agents import DEFAULT_POLICY
from rlinkd.daemon.config import ConfigValue
from rlinkd.daemon.frozen import load_frozen
from rlinkd.daemon.learner.policy_learner import PolicyLearner
from rlinkd.daemon.learner.replay_learner import ReplayLearner
from rlinkd.daemon.log import reload_level
from rlinkd.daemon.policies import reloaded_sections
from rlinkd.daemon.roles import RoleContext
from rlinkd.daemon.wiring import PolicyTopology, Topology
from rlinkd.shm.board import WeightsBoard

log = structlog.get_logger("learner")


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
            p.name: self._make_policy(p) for p in topo.trainable()}
        self._turn = 0

    def _make_policy(self, policy: PolicyTopology) -> PolicyLearner | ReplayLearner:
        return (ReplayLearner if policy.uses_replay else PolicyLearner)(policy, self.topo.cfg, self.ctx)

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
        self._after_policies_booted()
        resumed = next((p.resumed_from for p in self.policies.values() if p.resumed_from), "")
        self.ctx.send("supervisor", m.LearnerReady(self.seq_no, resumed))
        for learner in self.policies.values():
            learner.redo_orphans()

    def _after_policies_booted(self) -> None:
        """Nothing for a daemon alone (a job's shell enters the job here)."""

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
        """Serialise every policy's state, and send it with the versions and the collector's
        counters read together with it (no update runs in between): a resume continues
        from the very counters its weights belong to."""
        generations, seq_nos = {}, {p.name: p.seq_no for p in self.policies.values()}
        counters = self.topo.read_counters()
        try:
            for learner in self.policies.values():
                generations[learner.name] = learner.write_snapshot()
            reply = m.SnapshotReady(msg.request_id, generations, seq_nos, True, "", counters)
        except (ValueError, OSError) as exc:
            reply = m.SnapshotReady(msg.request_id, {}, seq_nos, False, str(exc), counters)
        self.ctx.send("checkpointer", reply)

    def on_reload(self, msg: m.Reload) -> None:
        """Reloaded hyperparameters, each policy its own (``policies.reloaded_sections``)."""
        reload_level(msg.changes, "learner")
        for learner in self.policies.values():
            parts = reloaded_sections(self.topo.cfg, learner.name, msg.changes)
            section = learner.algorithm if isinstance(learner, ReplayLearner) else "ppo"
            lr = _float_or_none(parts.get(section, {}).get("lr"))
            ent = _float_or_none(parts.get("ppo", {}).get("ent_coef"))
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


def _float_or_none(value: ConfigValue | None) -> float | None:
    """A reloaded number (its type was checked when the Reload was built) as a float."""
    return None if value is None else float(value)
