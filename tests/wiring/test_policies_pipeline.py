"""Tier 2: two trainable policies through connector, learner and checkpointer (real
segments and inboxes, roles as threads); the test plays the collector: it writes each
policy's episode ring and reads the collector inbox."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from rlinkd.client_lib.protocol.fragments import Fragment
from rlinkd.client_lib.protocol.records import concat_records, fragment_records
from rlinkd.daemon import messages as m
from rlinkd.daemon.checkpoint import store
from rlinkd.daemon.config import load_config
from rlinkd.daemon.export import checkpoint_policies, export_policy
from rlinkd.daemon.roles import RoleContext, run_role
from rlinkd.daemon.wiring import build_topology, destroy_topology
from rlinkd.shm.doorbell import Doorbell
from rlinkd.shm.ring import StepRing
from tests.helpers import wait_for

ROLES = ("connector", "learner", "checkpointer")


@pytest.fixture
def pipeline(tmp_path):
    cfg = load_config(None, [("daemon", "state_dir", str(tmp_path / "state")),
                             ("sampling", "train_batch_size", 64), ("ppo", "minibatch_size", 32),
                             ("ppo", "num_epochs", 1), ("policies", "red.ppo.lr", 0.01)])
    topo = build_topology(cfg)
    contexts = {role: RoleContext(role, topo, in_process=True) for role in ROLES}
    threads = [threading.Thread(target=run_role, args=(role, topo, contexts[role]), daemon=True)
               for role in ROLES]
    for t in threads:
        t.start()
    rings = {p.name: StepRing.attach(p.episode_ring_path, expected_layout=p.layout,
                                     doorbell=Doorbell.from_fd(topo.episode_doorbell.fd))
             for p in topo.trainable()}
    yield topo, rings, Published(topo)
    for ctx in contexts.values():
        ctx.stop.set()
    for t in threads:
        t.join(30)
    for ring in rings.values():
        ring.close()
    destroy_topology(topo)


class Published:
    """The collector inbox as the test reads it: the newest WeightsPublished per policy."""

    def __init__(self, topo) -> None:
        self.inbox, self.latest, self.supervisor = topo.inboxes["collector"], {}, topo.inboxes["supervisor"]

    def poll(self) -> dict[str, m.WeightsPublished]:
        for msg in self.inbox.drain():
            if isinstance(msg, m.WeightsPublished):
                self.latest[msg.policy] = msg
        return self.latest

    def seq(self, policy: str) -> int:
        got = self.poll().get(policy)
        return -1 if got is None else got.seq_no


def write_steps(ring: StepRing, steps: int, first_id: int, seed: int) -> int:
    """``steps`` CartPole-like steps as fragments of 20, with ingest ids from ``first_id``."""
    rng, parts = np.random.default_rng(seed), []
    for start in range(0, steps, 20):
        frag = Fragment(obs={"": rng.uniform(-0.1, 0.1, (21, 4)).astype(np.float32)},
                        actions=rng.integers(0, 2, (20, 1)).astype(np.float32),
                        rewards=np.ones(20), is_terminated=True, is_truncated=False)
        parts.append(fragment_records(frag, ring.layout, stream_id=1 + start, weights_seq_no=0))
    rec = concat_records(parts, ring.layout.dtype)
    rec["ingest_id"] = np.arange(first_id, first_id + len(rec))
    ring.write_batch(rec, timeout_s=10)
    return first_id + len(rec)


def test_each_policy_trains_on_its_own_data_and_checkpoints_under_its_name(pipeline, tmp_path):
    topo, rings, published = pipeline
    wait_for(lambda: published.seq("default") == 0 and published.seq("red") == 0, 60,
             what="both policies booted")
    write_steps(rings["red"], 200, 1, seed=1)
    wait_for(lambda: published.seq("red") >= 1, 60, what="red trained on its data")
    assert published.seq("default") == 0          # no data for default: it did not move
    red = published.latest["red"]
    assert red.trained and red.learner.lr == 0.01  # red's own [policies.red.ppo]
    write_steps(rings["default"], 200, 1, seed=2)  # ingest ids are per policy ring
    wait_for(lambda: published.seq("default") >= 1, 60, what="default trained on its data")
    assert published.latest["default"].learner.lr == topo.cfg.ppo.lr != 0.01

    topo.inboxes["checkpointer"].send(m.CheckpointRequest(1, "request"))
    done = wait_for(lambda: next((x for x in topo.inboxes["supervisor"].drain()
                                  if isinstance(x, m.CheckpointDone)), None), 60, what="checkpoint")
    assert done.ok, done.error
    ckpt = store.verify(store.checkpoints_dir(topo.cfg.state_dir) / done.path.rsplit("/", 1)[1])
    assert checkpoint_policies(ckpt) == ["default", "red"]
    assert set(ckpt.manifest["policies"]) == {"default", "red"}
    assert ckpt.manifest["policies"]["red"] >= 1
    result = export_policy(tmp_path / "red.onnx", topo.cfg.state_dir, policy="red")
    assert result.weights_seq_no == ckpt.manifest["policies"]["red"]
    assert result.onnx_path.read_bytes() == (ckpt.path / "policies/red/policy.onnx").read_bytes()
