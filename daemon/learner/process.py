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
import math
import time
from types import SimpleNamespace

import numpy as np
import structlog

from rlinkd.daemon import messages as m
from rlinkd.daemon.checkpoint.store import read_checkpoint_file
from rlinkd.daemon.config import Config
from rlinkd.daemon.errors import ExitCode
from rlinkd.daemon.log import reload_level
from rlinkd.daemon.roles import BootError, RoleContext
from rlinkd.daemon.wiring import Topology
from rlinkd.shm.blob import BlobArea
from rlinkd.shm.board import WeightsBoard
from rlinkd.shm.slots import BatchSlots

log = structlog.get_logger("learner")
IDLE_WAIT_S = 0.25
BATCH_COLUMNS = ("obs", "actions", "logp", "advantages", "value_targets", "values")


def hparams(cfg: Config) -> SimpleNamespace:
    """The Learner's hyperparameters from [ppo] and [learner]."""
    p = cfg.ppo
    return SimpleNamespace(
        lr=p.lr, gamma=p.gamma, gae_lambda=p.gae_lambda, clip_coef=p.clip_coef,
        vf_coef=p.vf_coef, ent_coef=p.ent_coef, num_epochs=p.num_epochs,
        minibatch_size=p.minibatch_size, max_grad_norm=p.max_grad_norm,
        clip_vloss=p.clip_vloss, target_kl=p.target_kl or None,
        normalize_observations=p.normalize_observations,
        torch_threads=cfg.learner.torch_threads)


class LearnerShell:
    """Owns the Learner core and the shared-memory endpoints."""

    def __init__(self, topo: Topology, ctx: RoleContext) -> None:
        from rlinkd.daemon.learner.learner import Learner  # torch is imported here, and only here
        self.topo, self.ctx, cfg = topo, ctx, topo.cfg
        try:
            self.learner = Learner(topo.policy_spec, hparams(cfg), device=cfg.learner.device,
                                   seed=cfg.learner.seed)
        except RuntimeError as exc:
            raise BootError(f"cannot create the learner on device {cfg.learner.device!r}: {exc}")
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
        import torch
        payload = read_checkpoint_file(path, "learner.pt")
        state = torch.load(io.BytesIO(payload), weights_only=True, map_location="cpu")
        self.learner.load_state_dict(state["learner"])
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
        rows, meta = self.slots.rows(slot), self.slots.meta(slot)
        update = None
        if rows > 0:
            try:
                update = train_stats(self._update(slot, rows), self.policy_lag(meta))
            except ValueError as exc:  # a batch the learner refuses (NaN, shapes): skip it
                log.error("batch_rejected", slot=slot, rows=rows, error=str(exc))
                self.rejected_batches += 1
        if update is not None:
            self.seq_no += 1
            self.board.publish(self.seq_no, self.learner.flat_weights())
        self.slots.release(slot)
        self.ctx.send("collector", m.WeightsPublished(self.seq_no, meta["ingest_cutoff"],
                                                      self.state(), update))
        self.ctx.heartbeat()

    def policy_lag(self, meta: dict) -> dict:
        """How many versions older than the weights just trained from the batch's data was
        (``self.seq_no`` is still that version here); None when no version was known."""
        if meta["behaviour_steps"] <= 0:
            return {"policy_lag_max": None, "policy_lag_mean": None}
        return {"policy_lag_max": int(self.seq_no - meta["behaviour_min"]),
                "policy_lag_mean": round(self.seq_no - meta["behaviour_sum"] / meta["behaviour_steps"], 3)}

    def _update(self, slot: int, rows: int) -> dict:
        cols = self.slots.columns(slot)
        batch = {name: np.array(cols[name][:rows]) for name in BATCH_COLUMNS}
        stats = self.learner.update(batch)
        if self.topo.cfg.ppo.normalize_observations:
            self.learner.update_obs_normalizer(batch["obs"])
        return {k: float(v) for k, v in stats.items()}

    def state(self) -> m.LearnerState:
        """Live hyperparameters and counters, sent with every WeightsPublished."""
        return m.LearnerState(lr=self.learner.optimizer.param_groups[0]["lr"],
                              ent_coef=self.learner.ent_coef, updates=self.learner.updates,
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
        lr, ent = msg.changes.get("ppo.lr"), msg.changes.get("ppo.ent_coef")
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


def train_stats(stats: dict[str, float], lag: dict) -> m.TrainStats:
    """``Learner.update``'s stats and the batch's policy lag as the typed report."""
    ev = stats["explained_variance"]
    return m.TrainStats(
        loss=stats["loss"], policy_loss=stats["policy_loss"], value_loss=stats["value_loss"],
        entropy=stats["entropy"], approx_kl=stats["approx_kl"], clip_frac=stats["clip_frac"],
        grad_norm=stats["grad_norm"], explained_variance=None if math.isnan(ev) else ev,
        epochs=int(stats["epochs"]), n_rows=int(stats["n_rows"]),
        update_time_s=stats["update_time_s"], **lag)


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
