"""Checkpointer process: turns checkpoint requests into verified directories on disk.

Flow for one request (from the supervisor: timer, SIGUSR1, shutdown):
``CheckpointRequest`` → ask the learner for a ``SnapshotRequest`` → the learner
serialises its state into the shared-memory snapshot area → ``SnapshotReady`` →
this process writes the checkpoint atomically (``store.write_checkpoint``), prunes
old ones, and reports ``CheckpointDone``. The learner never waits on disk I/O.
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass

import numpy as np
import structlog

from rlinkd.client_lib.protocol.policy_spec import OnnxWeightWriter
from rlinkd.daemon import messages as m
from rlinkd.daemon.checkpoint import store
from rlinkd.daemon.config import Config, apply_changes, to_toml
from rlinkd.daemon.errors import CheckpointError, ConfigError, ExitCode
from rlinkd.daemon.export import POLICY_FILE, policy_description
from rlinkd.daemon.log import reload_level
from rlinkd.daemon.roles import RoleContext
from rlinkd.daemon.version import package_version
from rlinkd.daemon.wiring import PolicyTopology, Topology
from rlinkd.shm.blob import BlobArea
from rlinkd.daemon.checkpoint.replay_files import replay_files
from rlinkd.shm.board import WeightsBoard
from rlinkd.shm.replay import ReplayBuffer

log = structlog.get_logger("checkpointer")
SNAPSHOT_TIMEOUT_S = 60.0


class PolicyFiles:
    """One trainable policy's part of a checkpoint (``store.policy_file`` says where)."""

    def __init__(self, policy: PolicyTopology) -> None:
        self.policy = policy
        self.snapshot = BlobArea.attach(policy.snapshot_path)
        self.board = WeightsBoard.attach(policy.board_path)
        self._onnx: OnnxWeightWriter | None = None  # built at the first checkpoint (imports onnx)
        description = policy_description(policy.obs_space, policy.act_space, policy.spec)
        self.policy_json = json.dumps(description, indent=1).encode()  # keeps Dict key order
        self.replay: ReplayBuffer | None = None  # DQN with checkpoint.save_replay

    def files(self, generation: int, seq_no: int) -> dict[str, bytes]:
        """learner.pt (the snapshot of ``generation``), policy.json, and policy.onnx when the
        board still holds version ``seq_no``. CheckpointError if the snapshot moved on."""
        found, payload = self.snapshot.read()
        if found != generation:
            raise CheckpointError(f"policy {self.policy.name}: snapshot area was overwritten "
                                  "before it could be saved")
        name = lambda file: store.policy_file(self.policy.name, file)  # noqa: E731
        out = {name("learner.pt"): payload, name(POLICY_FILE): self.policy_json}
        seq, flat = self.board.read(np.empty(self.policy.spec.n_params(), np.float32))
        if seq == seq_no:
            self._onnx = self._onnx or OnnxWeightWriter(self.policy.spec)
            out[name("policy.onnx")] = self._onnx.encode(flat)
        if self.replay is not None:
            out.update(replay_files(self.policy.name, self.replay))
        return out


@dataclass
class Pending:
    request: m.CheckpointRequest
    asked_at: float = 0.0


class Checkpointer:
    """Requests and the write path.

    One snapshot is asked of the learner at a time (``asking``): the learner serialises every
    request it gets into the one snapshot area, so a second request in flight would overwrite
    the first's snapshot before it was saved. Requests that come meanwhile wait (``waiting``)
    and are answered together by the next checkpoint, which is newer than each of them.

    ``cfg`` is the config in force: the spawn-time one with every SIGHUP reload
    applied (``Reload``); each checkpoint saves it and its sha256.
    """

    def __init__(self, topo: Topology, ctx: RoleContext) -> None:
        self.topo, self.ctx = topo, ctx
        self.cfg: Config = topo.cfg
        self.root = store.checkpoints_dir(topo.cfg.daemon.state_dir)
        self.policies = {p.name: PolicyFiles(p) for p in topo.trainable()}
        for p in topo.trainable():
            if p.uses_replay and topo.cfg.checkpoint.save_replay:
                self.policies[p.name].replay = ReplayBuffer.attach(p.replay_path)
        self.asking: list[Pending] = []   # the requests the snapshot in flight answers
        self.waiting: list[Pending] = []  # requests that came while it was in flight

    def on_request(self, req: m.CheckpointRequest) -> None:
        self.waiting.append(Pending(req))
        self._ask_next()

    def _ask_next(self) -> None:
        """Ask for one snapshot for every waiting request, unless one is in flight."""
        if self.asking or not self.waiting:
            return
        self.asking, self.waiting = self.waiting, []
        self.asking[0].asked_at = time.monotonic()
        self.ctx.send("learner", m.SnapshotRequest(self.asking[0].request.request_id))

    def on_snapshot(self, snap: m.SnapshotReady) -> None:
        if not self.asking or snap.request_id != self.asking[0].request.request_id:
            return  # (an answer to a request that already timed out)
        group, self.asking = self.asking, []
        reason = ", ".join(dict.fromkeys(p.request.reason for p in group))
        try:
            if not snap.ok:
                raise CheckpointError(f"learner could not snapshot: {snap.error}")
            ckpt = self._write(reason, snap)
        except (CheckpointError, OSError, ValueError) as exc:
            log.error("checkpoint_failed", reason=reason, error=str(exc))
            self._answer(group, False, "", snap.seq_no, str(exc))
        else:
            log.info("checkpoint_written", path=str(ckpt.path), reason=reason,
                     weights_seq_no=snap.seq_no)
            self._answer(group, True, str(ckpt.path), snap.seq_no, "")
        self._ask_next()

    def _answer(self, group: list[Pending], ok: bool, path: str, seq_no: int, error: str) -> None:
        for p in group:
            self.ctx.send("supervisor", m.CheckpointDone(p.request.request_id, p.request.reason,
                                                         ok, path, seq_no, error))

    def _write(self, reason: str, snap: m.SnapshotReady) -> store.Checkpoint:
        config_text = to_toml(self.cfg).encode()
        files = {"config.toml": config_text}
        for name, policy in self.policies.items():
            files.update(policy.files(snap.generations.get(name, -1), snap.seq_nos.get(name, -1)))
        meta = {"package_version": package_version(), "reason": reason,
                "config_sha256": hashlib.sha256(config_text).hexdigest(),
                "counters": dict(snap.counters), "weights_seq_no": snap.seq_no,
                "policies": dict(snap.seq_nos)}
        ckpt = store.write_checkpoint(self.root, files, meta)
        store.prune(self.root, self.cfg.checkpoint.keep_checkpoints)
        return ckpt

    def expire(self) -> None:
        """A snapshot the learner never sent (it was killed) fails its requests after a
        timeout; the waiting ones are asked for next."""
        if self.asking and time.monotonic() - self.asking[0].asked_at > SNAPSHOT_TIMEOUT_S:
            group, self.asking = self.asking, []
            self._answer(group, False, "", -1, "learner did not answer in time")
            self._ask_next()

    def on_reload(self, msg: m.Reload) -> None:
        reload_level(msg.changes, "checkpointer")
        try:
            self.cfg = apply_changes(self.cfg, msg.changes)
        except ConfigError as exc:  # (the supervisor computes reloads against this config)
            log.error("reload_not_applied", error=str(exc))

    def router(self) -> m.Router:
        return m.Router("checkpointer", {m.CheckpointRequest: self.on_request,
                                         m.SnapshotReady: self.on_snapshot,
                                         m.Reload: self.on_reload,
                                         m.Stop: lambda _msg: self.ctx.stop.set()})


def run(topo: Topology, ctx: RoleContext) -> ExitCode:
    """The checkpointer's process loop."""
    cp = Checkpointer(topo, ctx)
    handle = cp.router()
    log.info("checkpointer_ready", keep=cp.cfg.checkpoint.keep_checkpoints)
    while not ctx.stop.is_set():
        ctx.heartbeat()
        msg = ctx.inbox.recv(0.25)
        if msg is not None:
            handle(msg)
        cp.expire()
    return ExitCode.OK
