"""Tier 2: a recurrent policy through connector, learner and checkpointer (real segments and
inboxes, roles as threads); the test plays the collector, writing step records with the state
grid into the episode ring. The policy trains, checkpoints, and `rlinkd export` of that
checkpoint writes a model that acts with its state and a sidecar with the state contract."""
from __future__ import annotations

import json
import threading

import numpy as np
import onnxruntime as ort
import pytest

from rlinkd.client_lib.protocol import netops
from rlinkd.client_lib.protocol.netnumpy import NumpyNet
from rlinkd.client_lib.protocol.policy_spec import ONNX_INPUT_NAME
from rlinkd.client_lib.protocol.records import concat_records
from rlinkd.daemon import messages as m
from rlinkd.daemon.checkpoint import store
from rlinkd.daemon.config import load_config
from rlinkd.daemon.export import export_policy, load_policy
from rlinkd.daemon.roles import RoleContext, run_role
from rlinkd.daemon.wiring import build_topology, destroy_topology
from rlinkd.shm.doorbell import Doorbell
from rlinkd.shm.ring import StepRing
from tests.helpers import wait_for
from tests.recurrent_data import act_episode, fragment_records, noisy_weights
from tests.wiring.test_policies_pipeline import Published

ROLES = ("connector", "learner", "checkpointer")


@pytest.fixture
def pipeline(tmp_path):
    cfg = load_config(None, [("daemon", "state_dir", str(tmp_path / "state")),
                             ("sampling", "train_batch_size", 64), ("ppo", "minibatch_size", 32),
                             ("ppo", "num_epochs", 2), ("ppo", "recurrent", "lstm"),
                             ("ppo", "recurrent_size", 8), ("ppo", "max_seq_len", 5)])
    topo = build_topology(cfg)
    contexts = {role: RoleContext(role, topo, in_process=True) for role in ROLES}
    threads = [threading.Thread(target=run_role, args=(role, topo, contexts[role]), daemon=True)
               for role in ROLES]
    for t in threads:
        t.start()
    (policy,) = topo.trainable()
    ring = StepRing.attach(policy.episode_ring_path, expected_layout=policy.layout,
                           doorbell=Doorbell.from_fd(topo.episode_doorbell.fd))
    yield topo, policy, ring, Published(topo)
    for ctx in contexts.values():
        ctx.stop.set()
    for t in threads:
        t.join(30)
    ring.close()
    destroy_topology(topo)


def acted_records(spec, episodes: int, fragment_steps: int) -> np.ndarray:
    """Episodes acted from zero states, sent as fragments (state on each one's grid rows)."""
    flat, parts, ingest = noisy_weights(spec, seed=4), [], 1
    for e in range(episodes):
        steps = 9 + 3 * e
        ep = act_episode(spec, flat, steps, seed=e)
        for begin in range(0, steps, fragment_steps):
            end = min(begin + fragment_steps, steps)
            parts.append(fragment_records(spec, ep, begin, end, 1 + e, end == steps, ingest))
            ingest += end - begin + 1
    return concat_records(parts, parts[0].dtype)


def test_a_recurrent_policy_trains_checkpoints_and_exports(pipeline, tmp_path):
    topo, policy, ring, published = pipeline
    spec = policy.spec
    assert spec.state_size == 16 and policy.layout.state_size == 16
    wait_for(lambda: published.seq("default") == 0, 60, what="the policy booted")
    ring.write_batch(acted_records(spec, episodes=8, fragment_steps=7), timeout_s=10)
    wait_for(lambda: published.seq("default") >= 1, 60, what="trained on the recurrent records")
    assert published.latest["default"].trained

    topo.inboxes["checkpointer"].send(m.CheckpointRequest(1, "request"))
    done = wait_for(lambda: next((x for x in topo.inboxes["supervisor"].drain()
                                  if isinstance(x, m.CheckpointDone)), None), 60, what="checkpoint")
    assert done.ok, done.error
    ckpt = store.verify(store.checkpoints_dir(topo.cfg.state_dir) / done.path.rsplit("/", 1)[1])
    result = export_policy(tmp_path / "p.onnx", topo.cfg.state_dir)
    assert result.weights_seq_no == ckpt.manifest["weights_seq_no"] >= 1
    sidecar = json.loads(result.sidecar_path.read_text())
    assert sidecar["state"]["max_seq_len"] == 5 and sidecar["state"]["shape"] == ["batch", 16]

    flat = load_policy(ckpt).flat                            # the trained weights it holds
    session, net = ort.InferenceSession(str(result.onnx_path)), NumpyNet(spec, flat, (netops.DIST,))
    rng = np.random.default_rng(0)
    state = np.zeros((3, 16), np.float32)
    for _ in range(6):                                       # a few steps, the state carried
        obs = rng.uniform(-0.1, 0.1, (3, 4)).astype(np.float32)
        dist, state_out = session.run(None, {ONNX_INPUT_NAME: obs, "state_in": state})
        want = net.run({"": obs}, state)
        np.testing.assert_allclose(dist, want[netops.DIST], atol=1e-5, rtol=0)
        np.testing.assert_allclose(state_out, want[netops.STATE_OUT], atol=1e-5, rtol=0)
        state = state_out
