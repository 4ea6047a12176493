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
from rlinkd.daemon.errors import CheckpointError, ExitCode
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
    asked_at: float


class Checkpointer:
    """Pending requests and the write path.

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
        self.pending: dict[int, Pending] = {}

    def on_request(self, req: m.CheckpointRequest) -> None:
        self.pending[req.request_id] = Pending(req, time.monotonic())
        self.ctx.send("learner", m.SnapshotRequest(req.request_id))

    def on_snapshot(self, snap: m.SnapshotReady) -> None:
        pending = self.pending.pop(snap.request_id, None)
        if pending is None:
            return
        req = pending.request
        try:
            if not snap.ok:
                raise CheckpointError(f"learner could not snapshot: {snap.error}")
            ckpt = self._write(req, snap)
        except (CheckpointError, OSError, ValueError) as exc:
            log.error("checkpoint_failed", reason=req.reason, error=str(exc))
            self.ctx.send("supervisor", m.CheckpointDone(req.request_id, req.reason, False, "",
                                                         snap.seq_no, str(exc)))
            return
        log.info("checkpoint_written", path=str(ckpt.path), reason=req.reason,
                 weights_seq_no=snap.seq_no)
        self.ctx.send("supervisor", m.CheckpointDone(req.request_id, req.reason, True,
                                                     str(ckpt.path), snap.seq_no, ""))

    def _write(self, req: m.CheckpointRequest, snap: m.SnapshotReady) -> store.Checkpoint:
        config_text = to_toml(self.cfg).encode()
        files = {"config.toml": config_text}
        for name, policy in self.policies.items():
            files.update(policy.files(snap.generations.get(name, -1), snap.seq_nos.get(name, -1)))
        meta = {"package_version": package_version(), "reason": req.reason,
                "config_sha256": hashlib.sha256(config_text).hexdigest(),
                "counters": self.topo.read_counters(), "weights_seq_no": snap.seq_no,
                "policies": dict(snap.seq_nos)}
        ckpt = store.write_checkpoint(self.root, files, meta)
        store.prune(self.root, self.cfg.checkpoint.keep_checkpoints)
        return ckpt

    def expire(self) -> None:
        """Requests the learner never answered (e.g. it was killed) fail after a timeout."""
        now = time.monotonic()
        for rid, pending in list(self.pending.items()):
            if now - pending.asked_at > SNAPSHOT_TIMEOUT_S:
                del self.pending[rid]
                req = pending.request
                self.ctx.send("supervisor", m.CheckpointDone(rid, req.reason, False, "", -1,
                                                             "learner did not answer in time"))

    def on_reload(self, msg: m.Reload) -> None:
        reload_level(msg.changes, "checkpointer")
        self.cfg = apply_changes(self.cfg, msg.changes)

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
