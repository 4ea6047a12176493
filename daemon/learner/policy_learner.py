"""One trainable on-policy (PPO) policy inside the learner process: its ``Learner`` core and
its shared memory (weights board, batch slots, snapshot area), driven by ``LearnerShell``
(``daemon.learner.process``, whose docstring tells the start and the loop).
"""
from __future__ import annotations

import io
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from rlinkd.daemon import messages as m
from rlinkd.daemon.batch_schema import BatchMeta, read_columns
from rlinkd.daemon.checkpoint.store import policy_file, read_manifest
from rlinkd.daemon.config import Config
from rlinkd.daemon.learner.device_choice import device_fields
from rlinkd.daemon.learner.resume import resume_state
from rlinkd.daemon.roles import RoleContext
from rlinkd.daemon.wiring import PolicyTopology
from rlinkd.shm.blob import BlobArea
from rlinkd.shm.board import WeightsBoard
from rlinkd.shm.slots import BatchSlots

if TYPE_CHECKING:
    from rlinkd.daemon.learner.learner import Learner

log = structlog.get_logger("learner")


class PolicyLearner:
    """One trainable policy inside the learner process: its Learner core and its shared
    memory (weights board, batch slots, snapshot area). Driven by ``LearnerShell``."""

    def __init__(self, policy: PolicyTopology, cfg: Config, ctx: RoleContext) -> None:
        from rlinkd.daemon.learner.placement import built_on, place
        self.policy, self.ctx, self.name = policy, ctx, policy.name
        self.placement = place(policy.definition, cfg)
        self.learner = built_on(self.placement.device, cfg, lambda: self._make_learner(policy, cfg))
        self.board = WeightsBoard.attach(policy.board_path)
        self.slots = BatchSlots.attach(policy.slots_path)
        self.snapshot = BlobArea.attach(policy.snapshot_path)
        self.seq_no = 0
        self.resumed_from = ""
        self.rejected_batches = 0

    def _make_learner(self, policy: PolicyTopology, cfg: Config) -> Learner:
        from rlinkd.daemon.learner.learner import Learner  # torch is imported here, and only here
        return Learner(policy.spec, policy.definition.ppo, device=self.placement.device,
                       seed=cfg.learner.seed, torch_threads=cfg.learner.torch_threads)

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
            self.learner.adopt_weights(flat)
            log.info("adopted_board_weights", policy=self.name, board_seq_no=board_seq,
                     checkpoint_seq_no=self.seq_no)
            self.seq_no = board_seq

    def _resume(self, path: str) -> None:
        """State from the checkpoint, hyperparameters from the config (which, after a
        SIGHUP, is the reloaded one): log both so an override is never silent."""
        state, saved = resume_state(self.learner, path, self.name)
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


def _manifest_files(checkpoint: str) -> dict:
    return read_manifest(Path(checkpoint)).manifest.get("files", {})
