"""One off-policy policy inside the learner process: its DQN or SAC core, replay buffer,
weights board and snapshot area. Driven by ``LearnerShell`` exactly like ``PolicyLearner``.

Training never waits for batches and never makes clients wait: each ``train_ready`` call
runs the gradient steps the data allows, ``updates_per_step`` per transition received since
learning started (at most up to the next publication), and publishes the weights every
``publish_interval_updates`` steps. The replay buffer lives in shared memory made by the
wiring, so a restarted learner finds it full and goes on.
"""
from __future__ import annotations

import io
import os
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import structlog

from rlinkd.daemon import messages as m
from rlinkd.daemon.checkpoint.store import policy_file
from rlinkd.daemon.config import Config
from rlinkd.daemon.learner.device_choice import device_fields
from rlinkd.daemon.learner.resume import resume_state
from rlinkd.daemon.roles import RoleContext
from rlinkd.daemon.wiring import PolicyTopology
from rlinkd.shm.blob import BlobArea
from rlinkd.shm.board import WeightsBoard
from rlinkd.shm.replay import ReplayBuffer, ReplayLayout

log = structlog.get_logger("learner")


class ReplayLearner:
    """``PolicyLearner``'s interface (boot, train_ready, redo_orphans, write_snapshot,
    set_hparams, state, close) for an off-policy algorithm."""

    def __init__(self, policy: PolicyTopology, cfg: Config, ctx: RoleContext) -> None:
        self.policy, self.ctx, self.name = policy, ctx, policy.name
        self.algorithm = policy.definition.algorithm
        self.hp = policy.definition.replay_hp
        from rlinkd.daemon.learner.placement import built_on, place  # (imports torch)
        self.placement = place(policy.definition, cfg)
        self.core = built_on(self.placement.device, cfg, lambda: self._make_core(policy, cfg))
        self.board = WeightsBoard.attach(policy.board_path)
        self.replay = ReplayBuffer.attach(policy.replay_path, ReplayLayout(policy.layout))
        self.replay.set_pid("reader", os.getpid())
        self.snapshot = BlobArea.attach(policy.snapshot_path)
        self.rng = np.random.default_rng((cfg.learner.seed, 2))
        self.seq_no = 0
        self.resumed_from = ""
        self.seen_written = 0            # replay.written already counted in core.env_steps
        self.start: tuple[int, int] | None = None  # (written, updates) when learning started
        self.pending: list[Mapping[str, float]] = []  # step stats since the last publication
        self.pending_s = 0.0
        self.report_interval_s = cfg.daemon.status_interval_s
        self.next_report = 0.0

    def _make_core(self, policy: PolicyTopology, cfg: Config) -> Any:
        return _core_class(self.algorithm)(policy.spec, self.hp, device=self.placement.device,
                                           seed=cfg.learner.seed, torch_threads=cfg.learner.torch_threads)

    # ------------------------------------------------------------ start
    def boot(self, checkpoint: str) -> None:
        """Resume (when the checkpoint holds this policy), adopt newer board weights, publish."""
        if checkpoint and _holds(checkpoint, policy_file(self.name, "learner.pt")):
            self._resume(checkpoint)
        board_seq = self.board.latest_seq_no()
        if board_seq > self.seq_no:  # a restarted learner goes on from the newest weights
            _, flat = self.board.read()
            self.core.model.load_flat(flat)
            self.seq_no = board_seq
        self.seen_written = self.replay.written  # (what a predecessor already counted)
        if not self.resumed_from:  # a restart without a checkpoint: epsilon goes on from the data
            self.core.env_steps = max(self.core.env_steps, self.seen_written)
        self._publish(None)
        log.info("learner_ready", policy=self.name, algorithm=self.algorithm, seq_no=self.seq_no,
                 device=str(self.core.device), resumed_from=self.resumed_from or None,
                 replay_steps=len(self.replay))

    def _resume(self, path: str) -> None:
        state, saved = resume_state(self.core, path, self.name)
        log.info("hparams_from_config", policy=self.name, lr=self.hp.lr, checkpoint_lr=saved["lr"])
        self.seq_no = int(state["weights_seq_no"])
        self.rng.bit_generator.state = state["sampler_rng"]
        self.resumed_from = path

    def redo_orphans(self) -> None:
        """Nothing: replay sampling leaves no half-trained batch behind."""

    # ------------------------------------------------------------ training
    def train_ready(self) -> bool:
        """The gradient steps the data allows now (up to the next publication); True if any ran."""
        steps = self._allowed_steps()
        if steps < 1:
            self._maybe_report()
            return False
        started = time.perf_counter()
        for _ in range(steps):
            rows = self.replay.sample(self.hp.batch_size, self.rng)
            assert rows is not None  # (learning starts only with a non-empty buffer)
            self.pending.append(self.core.train_step(rows))
        self.pending_s += time.perf_counter() - started
        self.ctx.heartbeat()
        if self.core.updates % self.hp.publish_interval_updates == 0:
            self._publish(self._summary())
        return True

    def _maybe_report(self) -> None:
        """Before learning starts nothing is published: report the filling buffer now and then."""
        now = time.monotonic()
        if now >= self.next_report:
            self.next_report = now + self.report_interval_s
            self.ctx.send("collector", m.WeightsPublished(self.seq_no, -1, self.state(), None, self.name))

    def _allowed_steps(self) -> int:
        """The steps due now, up to the next publication."""
        to_publish = self.hp.publish_interval_updates - self.core.updates % self.hp.publish_interval_updates
        return min(self._due_steps(), to_publish)

    def _due_steps(self) -> int:
        """Gradient steps this learner's own data makes due now (0 before its learning
        start): ``updates_per_step`` per transition written since then, less the steps done
        (``_steps_done``); the transitions new since the last call go to ``_received``."""
        written = self.replay.written
        self._received(written - self.seen_written)
        self.seen_written = written
        if self.start is None:
            if len(self.replay) < self.hp.learning_starts_steps:
                return 0
            self.start = (written, self._steps_done())
        due = int((written - self.start[0]) * self.hp.updates_per_step) - (self._steps_done() - self.start[1])
        return max(0, due)

    def _received(self, transitions: int) -> None:
        """New transitions in this learner's replay: its env-step count (schedules)."""
        self.core.env_steps += transitions

    def _steps_done(self) -> int:
        """The gradient steps this learner's data has been sampled for."""
        return self.core.updates

    def _summary(self) -> m.TrainStats:
        from rlinkd.daemon.learner.learner import mean_stats  # (imports torch)
        means = mean_stats(self.pending)  # (the steps' statistics, read from the device at once)
        means["n_rows"] = float(len(self.pending) * self.hp.batch_size)
        stats = m.off_policy_stats(means, len(self.pending), self.pending_s)
        self.pending, self.pending_s = [], 0.0
        return stats

    def _publish(self, update: m.TrainStats | None) -> None:
        if update is not None:
            self.seq_no += 1
        self.board.publish(self.seq_no, self.core.flat_weights())
        self.ctx.send("collector", m.WeightsPublished(self.seq_no, -1, self.state(), update, self.name))

    def state(self) -> m.LearnerState:
        return m.LearnerState(lr=float(self.core.hp.lr), ent_coef=self.core.ent_coef,
                              updates=self.core.updates,
                              trained_steps=self.core.trained_steps, rejected_batches=0,
                              algorithm=self.algorithm, epsilon=self.core.epsilon,
                              replay_steps=len(self.replay), lag_steps=self._lag_steps(),
                              **device_fields(self.placement))

    def _lag_steps(self) -> int:
        """Env steps received whose gradient steps are still due (0 before learning starts)."""
        if self.start is None:
            return 0
        due = (self.replay.written - self.start[0]) * self.hp.updates_per_step
        done = self._steps_done() - self.start[1]
        return max(0, int((due - done) / self.hp.updates_per_step))

    # ------------------------------------------------------------ control
    def write_snapshot(self) -> int:
        import torch
        buf = io.BytesIO()
        torch.save({"learner": self.core.state_dict(), "weights_seq_no": self.seq_no,
                    "sampler_rng": self.rng.bit_generator.state}, buf)
        return self.snapshot.write(buf.getvalue())

    def set_hparams(self, lr: float | None, ent_coef: float | None) -> None:
        """A reloaded ``dqn.lr`` / ``sac.lr`` (``ent_coef`` means nothing here: SAC tunes its own)."""
        self.core.set_hparams(lr=lr)
        self.hp = self.core.hp
        self._publish(None)

    def close(self) -> None:
        for part in (self.replay, self.board, self.snapshot):
            part.close()


def _core_class(algorithm: str) -> type:
    """The learner core of a replay algorithm (torch is imported here, not at module import)."""
    if algorithm == "sac":
        from rlinkd.daemon.learner.sac_learner import SACLearner
        return SACLearner
    from rlinkd.daemon.learner.dqn_learner import DQNLearner
    return DQNLearner


def _holds(checkpoint: str, name: str) -> bool:
    from pathlib import Path

    from rlinkd.daemon.checkpoint.store import read_manifest
    return name in read_manifest(Path(checkpoint)).manifest.get("files", {})
