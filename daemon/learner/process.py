"""Learner process shell: slots in, weights out, snapshots on request.

On start it loads the newest verified checkpoint (if the supervisor found one),
continues ``weights_seq_no`` from max(checkpoint, weights board) so clients see a
monotonic sequence even across learner restarts, publishes its weights, redoes
any batch a killed predecessor left in TRAINING, and then loops: the inbox is a
doorbell (BatchReady) and a control channel (SnapshotRequest, Reload, Stop);
the slot states in shared memory are the truth about pending batches.
"""
from __future__ import annotations

import io
import time

import structlog

from rlinkd.daemon import messages as m
from rlinkd.daemon.batch_schema import BatchMeta, read_columns
from rlinkd.daemon.checkpoint.store import read_checkpoint_file
from rlinkd.daemon.config import ConfigValue
from rlinkd.daemon.errors import ExitCode
from rlinkd.daemon.log import reload_level
from rlinkd.daemon.roles import BootError, RoleContext
from rlinkd.daemon.wiring import Topology
from rlinkd.shm.blob import BlobArea
from rlinkd.shm.board import WeightsBoard
from rlinkd.shm.slots import BatchSlots

log = structlog.get_logger("learner")
IDLE_WAIT_S = 0.25


class LearnerShell:
    """Owns the Learner core and the shared-memory endpoints."""

    def __init__(self, topo: Topology, ctx: RoleContext) -> None:
        from rlinkd.daemon.learner.learner import Learner  # torch is imported here, and only here
        self.topo, self.ctx, cfg = topo, ctx, topo.cfg
        try:
            self.learner = Learner(topo.policy_spec, cfg.ppo, device=cfg.learner.device,
                                   seed=cfg.learner.seed, torch_threads=cfg.learner.torch_threads)
        except RuntimeError as exc:
            raise BootError(f"cannot create the learner on device {cfg.learner.device!r}: {exc}") from exc
        self.board = WeightsBoard.attach(topo.board_path)
        self.slots = BatchSlots.attach(topo.slots_path)
        self.snapshot = BlobArea.attach(topo.snapshot_path)
        self.seq_no = 0
        self.resumed_from = ""
        self.rejected_batches = 0

    # ------------------------------------------------------------ start
    def boot(self) -> None:
        """Resume, publish the first weights, redo orphaned batches, tell the supervisor."""
        if self.topo.resume_checkpoint:
            self._resume(self.topo.resume_checkpoint)
        self._adopt_newer_board_weights()
        self.board.publish(self.seq_no, self.learner.flat_weights())
        self.ctx.send("collector", m.WeightsPublished(self.seq_no, -1, self.state(), None))
        self.ctx.send("supervisor", m.LearnerReady(self.seq_no, self.resumed_from))
        log.info("learner_ready", seq_no=self.seq_no, device=str(self.learner.device),
                 resumed_from=self.resumed_from or None)
        for slot in self.slots.in_training():
            log.warning("redoing_orphaned_batch", slot=slot)
            self.train_slot(slot)

    def _adopt_newer_board_weights(self) -> None:
        """A restarted learner continues from the newest published weights, not the
        (older) checkpoint's: optimizer state and RNG come from the checkpoint."""
        board_seq = self.board.latest_seq_no()
        if board_seq > self.seq_no:
            _, flat = self.board.read()
            self.learner.model.load_flat(flat)
            log.info("adopted_board_weights", board_seq_no=board_seq, checkpoint_seq_no=self.seq_no)
            self.seq_no = board_seq

    def _resume(self, path: str) -> None:
        """State from the checkpoint, hyperparameters from the config (which, after a
        SIGHUP, is the reloaded one): log both so an override is never silent."""
        import torch
        payload = read_checkpoint_file(path, "learner.pt")
        state = torch.load(io.BytesIO(payload), weights_only=True, map_location="cpu")
        saved = self.learner.load_state_dict(state["learner"])
        live = self.learner.live_hparams()
        log.info("hparams_from_config", **live, **{f"checkpoint_{k}": v for k, v in saved.items()},
                 overridden=sorted(k for k in live if live[k] != saved[k]))
        self.seq_no = int(state["weights_seq_no"])
        self.resumed_from = path

    # ------------------------------------------------------------ training
    def train_one(self) -> bool:
        """Train the oldest ready batch, if any; True if one was trained. One per call, so
        the loop serves control messages (snapshots for checkpoints) between batches even
        when the connector always has the next batch ready."""
        if self.ctx.stop.is_set() or (slot := self.slots.take_ready()) is None:
            return False
        self.train_slot(slot)
        return True

    def train_slot(self, slot: int) -> None:
        """Train on one slot (or answer an empty flush), publish, release, notify."""
        rows, meta = self.slots.rows(slot), BatchMeta.from_slot_meta(self.slots.meta(slot))
        update, trained_from = None, self.seq_no
        if rows > 0:
            try:
                update = m.train_stats(self._update(slot, rows), *meta.policy_lag(trained_from))
            except ValueError as exc:  # a batch the learner refuses (NaN, shapes): skip it
                log.error("batch_rejected", slot=slot, rows=rows, error=str(exc))
                self.rejected_batches += 1
        if update is not None:
            self.seq_no += 1
            self.board.publish(self.seq_no, self.learner.flat_weights())
        self.slots.release(slot)
        self.ctx.send("collector", m.WeightsPublished(self.seq_no, meta.ingest_cutoff,
                                                      self.state(), update))
        self.ctx.heartbeat()

    def _update(self, slot: int, rows: int) -> dict:
        """One update, heart-beating after every minibatch step: a long update (a big
        network on a CPU) is progress, not a hang; a learner stuck inside one step still
        falls silent and gets SIGABRT after daemon.heartbeat_timeout_s."""
        batch = read_columns(self.slots.columns(slot), rows, self.topo.policy_spec)
        stats = self.learner.update(batch, on_step=self.ctx.heartbeat)
        return {k: float(v) for k, v in stats.items()}

    def state(self) -> m.LearnerState:
        """Live hyperparameters and counters, sent with every WeightsPublished."""
        live = self.learner.live_hparams()
        return m.LearnerState(lr=live["lr"], ent_coef=live["ent_coef"],
                              updates=self.learner.updates,
                              trained_steps=self.learner.trained_steps,
                              rejected_batches=self.rejected_batches)

    # ------------------------------------------------------------ control
    def on_snapshot_request(self, msg: m.SnapshotRequest) -> None:
        import torch
        buf = io.BytesIO()
        try:
            torch.save({"learner": self.learner.state_dict(), "weights_seq_no": self.seq_no}, buf)
            generation = self.snapshot.write(buf.getvalue())
            reply = m.SnapshotReady(msg.request_id, generation, self.seq_no, True, "")
        except (ValueError, OSError) as exc:
            reply = m.SnapshotReady(msg.request_id, -1, self.seq_no, False, str(exc))
        self.ctx.send("checkpointer", reply)

    def on_reload(self, msg: m.Reload) -> None:
        reload_level(msg.changes, "learner")
        lr, ent = _float_or_none(msg.changes.get("ppo.lr")), _float_or_none(msg.changes.get("ppo.ent_coef"))
        if lr is not None or ent is not None:
            self.learner.set_hparams(lr=lr, ent_coef=ent)
            log.info("hparams_reloaded", lr=lr, ent_coef=ent)
            self.ctx.send("collector", m.WeightsPublished(self.seq_no, -1, self.state(), None))

    def router(self) -> m.Router:
        """BatchReady is only a doorbell (it ends the inbox wait); slot states are the truth."""
        return m.Router("learner", {m.SnapshotRequest: self.on_snapshot_request,
                                    m.Reload: self.on_reload,
                                    m.Stop: lambda _msg: self.ctx.stop.set()},
                        ignore=(m.BatchReady,))


def run(topo: Topology, ctx: RoleContext) -> ExitCode:
    """The learner's process loop."""
    shell = LearnerShell(topo, ctx)
    handle = shell.router()
    shell.boot()
    busy = False
    while not ctx.stop.is_set():
        ctx.heartbeat()
        msg = ctx.inbox.recv(0 if busy else IDLE_WAIT_S)  # after a batch, only poll
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
