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

import io
import time
from pathlib import Path

import structlog

from rlinkd.daemon import messages as m
from rlinkd.daemon.batch_schema import BatchMeta, read_columns
from rlinkd.client_lib.protocol.agents import DEFAULT_POLICY
from rlinkd.daemon.checkpoint.store import policy_file, read_checkpoint_file, verify
from rlinkd.daemon.config import Config, ConfigValue
from rlinkd.daemon.errors import ExitCode
from rlinkd.daemon.frozen import load_frozen
from rlinkd.daemon.learner.device_choice import device_fields
from rlinkd.daemon.learner.replay_learner import ReplayLearner
from rlinkd.daemon.log import reload_level
from rlinkd.daemon.roles import BootError, RoleContext
from rlinkd.daemon.wiring import PolicyTopology, Topology
from rlinkd.shm.blob import BlobArea
from rlinkd.shm.board import WeightsBoard
from rlinkd.shm.slots import BatchSlots

log = structlog.get_logger("learner")
IDLE_WAIT_S = 0.25
OFF_POLICY_WAIT_S = 0.005  # an off-policy learner looks for new transitions this often


class PolicyLearner:
    """One trainable policy inside the learner process: its Learner core and its shared
    memory (weights board, batch slots, snapshot area). Driven by ``LearnerShell``."""

    def __init__(self, policy: PolicyTopology, cfg: Config, ctx: RoleContext) -> None:
        from rlinkd.daemon.learner.learner import Learner  # torch is imported here, and only here
        from rlinkd.daemon.learner.placement import place
        self.policy, self.ctx, self.name = policy, ctx, policy.name
        self.placement = place(policy.definition, cfg)
        try:
            self.learner = Learner(policy.spec, policy.definition.ppo, device=self.placement.device,
                                   seed=cfg.learner.seed, torch_threads=cfg.learner.torch_threads)
        except RuntimeError as exc:
            raise BootError(f"learner.device = {cfg.learner.device!r}: cannot create the learner "
                            f"on {self.placement.device}: {exc}") from exc
        self.board = WeightsBoard.attach(policy.board_path)
        self.slots = BatchSlots.attach(policy.slots_path)
        self.snapshot = BlobArea.attach(policy.snapshot_path)
        self.seq_no = 0
        self.resumed_from = ""
        self.rejected_batches = 0

    # ------------------------------------------------------------ start
    def boot(self, checkpoint: str) -> None:
        """Resume (when the checkpoint holds this policy), adopt newer board weights, publish."""
        if checkpoint and policy_file(self.name, "learner.pt") in _manifest_files(checkpoint):
            self._resume(checkpoint)
        self._adopt_newer_board_weights()
        self.board.publish(self.seq_no, self.learner.flat_weights())
        self._tell_collector(-1, None)
        log.info("learner_ready", policy=self.name, seq_no=self.seq_no,
                 device=str(self.learner.device), resumed_from=self.resumed_from or None)

    def _adopt_newer_board_weights(self) -> None:
        """A restarted learner continues from the newest published weights, not the
        (older) checkpoint's: optimizer state and RNG come from the checkpoint."""
        board_seq = self.board.latest_seq_no()
        if board_seq > self.seq_no:
            _, flat = self.board.read()
            self.learner.model.load_flat(flat)
            log.info("adopted_board_weights", policy=self.name, board_seq_no=board_seq,
                     checkpoint_seq_no=self.seq_no)
            self.seq_no = board_seq

    def _resume(self, path: str) -> None:
        """State from the checkpoint, hyperparameters from the config (which, after a
        SIGHUP, is the reloaded one): log both so an override is never silent."""
        import torch
        payload = read_checkpoint_file(path, policy_file(self.name, "learner.pt"))
        state = torch.load(io.BytesIO(payload), weights_only=True, map_location="cpu")
        saved = self.learner.load_state_dict(state["learner"])
        live = self.learner.live_hparams()
        log.info("hparams_from_config", policy=self.name, **live,
                 **{f"checkpoint_{k}": v for k, v in saved.items()},
                 overridden=sorted(k for k in live if live[k] != saved[k]))
        self.seq_no = int(state["weights_seq_no"])
        self.resumed_from = path

    # ------------------------------------------------------------ training
    def train_ready(self) -> bool:
        """Train the oldest ready batch, if any; True if one was trained."""
        slot = self.slots.take_ready()
        if slot is None:
            return False
        self.train_slot(slot)
        return True

    def redo_orphans(self) -> None:
        """Batches a killed predecessor left in TRAINING are trained again."""
        for slot in self.slots.in_training():
            log.warning("redoing_orphaned_batch", policy=self.name, slot=slot)
            self.train_slot(slot)

    def train_slot(self, slot: int) -> None:
        """Train on one slot (or answer an empty flush), publish, release, notify."""
        rows, meta = self.slots.rows(slot), BatchMeta.from_slot_meta(self.slots.meta(slot))
        update, trained_from = None, self.seq_no
        if rows > 0:
            try:
                update = m.train_stats(self._update(slot, rows), *meta.policy_lag(trained_from))
            except ValueError as exc:  # a batch the learner refuses (NaN, shapes): skip it
                log.error("batch_rejected", policy=self.name, slot=slot, rows=rows, error=str(exc))
                self.rejected_batches += 1
        if update is not None:
            self.seq_no += 1
            self.board.publish(self.seq_no, self.learner.flat_weights())
        self.slots.release(slot)
        self._tell_collector(meta.ingest_cutoff, update)
        self.ctx.heartbeat()

    def _update(self, slot: int, rows: int) -> dict:
        """One update, heart-beating after every minibatch step: a long update (a big
        network on a CPU) is progress, not a hang; a learner stuck inside one step still
        falls silent and gets SIGABRT after daemon.heartbeat_timeout_s."""
        batch = read_columns(self.slots.columns(slot), rows, self.policy.spec)
        stats = self.learner.update(batch, on_step=self.ctx.heartbeat)
        return {k: float(v) for k, v in stats.items()}

    def _tell_collector(self, cutoff: int, update: m.TrainStats | None) -> None:
        self.ctx.send("collector", m.WeightsPublished(self.seq_no, cutoff, self.state(), update,
                                                      self.name))

    def state(self) -> m.LearnerState:
        """Live hyperparameters and counters, sent with every WeightsPublished."""
        live = self.learner.live_hparams()
        return m.LearnerState(lr=live["lr"], ent_coef=live["ent_coef"],
                              updates=self.learner.updates,
                              trained_steps=self.learner.trained_steps,
                              rejected_batches=self.rejected_batches,
                              algorithm=self.policy.definition.algorithm,
                              **device_fields(self.placement))

    # ------------------------------------------------------------ control
    def write_snapshot(self) -> int:
        """Serialise the full state into the snapshot area; its generation (ValueError or
        OSError when it does not fit or cannot be written)."""
        import torch
        buf = io.BytesIO()
        torch.save({"learner": self.learner.state_dict(), "weights_seq_no": self.seq_no}, buf)
        return self.snapshot.write(buf.getvalue())

    def set_hparams(self, lr: float | None, ent_coef: float | None) -> None:
        self.learner.set_hparams(lr=lr, ent_coef=ent_coef)
        self._tell_collector(-1, None)

    def close(self) -> None:
        for part in (self.slots, self.board, self.snapshot):
            part.close()


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
            p.name: (ReplayLearner if p.uses_replay else PolicyLearner)(p, topo.cfg, ctx)
            for p in topo.trainable()}
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


def _manifest_files(checkpoint: str) -> dict:
    return verify(Path(checkpoint)).manifest.get("files", {})


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
