"""Tier 2: the real wiring with every role as a thread of the test process."""
from __future__ import annotations

import json

import gymnasium as gym
import pytest

from rlinkd.client_lib import run_env
from rlinkd.client_lib.transport import RLlinkClient
from rlinkd.daemon.checkpoint import store
from rlinkd.daemon.config import load_config
from rlinkd.daemon.inprocess import InProcessDaemon
from rlinkd.daemon.roster import ROLES


@pytest.fixture
def inproc(tmp_path):
    cfg = load_config(None, [("daemon", "state_dir", str(tmp_path / "state")),
                             ("server", "port", 0),
                             ("sampling", "env_steps_per_sample", 200),
                             ("sampling", "train_batch_size", 400),
                             ("ppo", "minibatch_size", 100)])
    d = InProcessDaemon(cfg).start()
    yield d
    codes = d.stop()
    assert codes == {role: 0 for role in ROLES}


def test_one_process_trains_and_checkpoints(inproc):
    port = inproc.listening.port
    stats = run_env(gym.make("CartPole-v1"), f"tcp://127.0.0.1:{port}", steps=1000, seed=0)
    assert stats.steps == 1000
    with RLlinkClient(f"unix://{inproc.listening.unix_socket}") as client:
        status = client.status()
    assert status["env_steps"] == 1000
    assert status["weights_seq_no"] >= 4  # 200-step on-policy samples, flushed one by one
    done = inproc.checkpoint()
    assert done.ok, done.error
    ckpt = store.verify(store.checkpoints_dir(inproc.cfg.state_dir) / "ckpt-000001")
    assert ckpt.weights_seq_no == status["weights_seq_no"]
    assert ckpt.counters == {"env_steps": 1000, "episodes": status["episodes"]}
    assert {"learner.pt", "policy.onnx", "config.toml", "policy.json"} <= set(ckpt.manifest["files"])


def test_export_of_a_real_checkpoint_equals_its_policy_onnx(inproc, tmp_path):
    """`rlinkd export` rebuilds the actor from learner.pt + policy.json; the checkpointer wrote
    policy.onnx from the weights board at the same weights_seq_no: the bytes must agree."""
    from rlinkd.daemon.export import export_policy
    run_env(gym.make("CartPole-v1"), f"tcp://127.0.0.1:{inproc.listening.port}", steps=400, seed=0)
    done = inproc.checkpoint()
    assert done.ok, done.error
    result = export_policy(tmp_path / "p.onnx", inproc.cfg.state_dir)
    assert result.weights_seq_no == done.seq_no >= 1 and str(result.checkpoint) == done.path
    assert result.onnx_path.read_bytes() == (result.checkpoint / "policy.onnx").read_bytes()
    meta = json.loads(result.sidecar_path.read_text())
    assert meta["observation_space"] == inproc.topo.default.obs_space.to_json()
    assert meta["policy_spec"] == inproc.topo.default.spec.to_json()


def test_checkpoint_carries_the_reloaded_config(inproc):
    """After a SIGHUP reload the checkpoint holds the config in force, and its hash."""
    import hashlib
    import tomllib

    from rlinkd.daemon import messages as m
    from rlinkd.daemon.wiring import ROLES
    changes = {"ppo.lr": 0.0005, "checkpoint.keep_checkpoints": 3}
    for role in ROLES:  # what the supervisor sends after a reload
        inproc.topo.inboxes[role].send(m.Reload(changes))
    done = inproc.checkpoint()
    assert done.ok, done.error
    ckpt = store.verify(store.checkpoints_dir(inproc.cfg.state_dir) / "ckpt-000001")
    text = (ckpt.path / "config.toml").read_bytes()
    saved = tomllib.loads(text.decode())
    assert saved["ppo"]["lr"] == 0.0005 and saved["checkpoint"]["keep_checkpoints"] == 3
    assert ckpt.manifest["config_sha256"] == hashlib.sha256(text).hexdigest()


def test_messages_larger_than_the_episode_ring_wait_for_space_and_all_arrive(tmp_path):
    """3000-step samples through a 1024-record ring: every ingest waits for the connector
    to free space (space doorbell) several times; nothing is lost or stuck."""
    cfg = load_config(None, [("daemon", "state_dir", str(tmp_path / "state")),
                             ("server", "port", 0),
                             ("sampling", "episode_ring_records", 1024),
                             ("sampling", "env_steps_per_sample", 3000),
                             ("sampling", "train_batch_size", 3000),
                             ("ppo", "minibatch_size", 500)])
    d = InProcessDaemon(cfg).start()
    try:
        stats = run_env(gym.make("CartPole-v1"), f"tcp://127.0.0.1:{d.listening.port}", steps=9000,
                        seed=0)
        assert stats.steps == 9000
        with RLlinkClient(f"unix://{d.listening.unix_socket}") as client:
            status = client.status()
        assert status["env_steps"] == 9000
        assert status["weights_seq_no"] >= 3  # each on-policy sample went through the ring and was trained on
    finally:
        assert d.stop() == {role: 0 for role in ROLES}


def test_an_attach_that_gets_no_ring_is_refused_and_shm_clients_train_after(inproc, monkeypatch):
    """No memfd to be had (seccomp, old kernel, no memory): ERROR to that client, connection
    closed, the collector carries on; then a real shm client attaches (descriptor passing)."""
    import errno
    import os

    from rlinkd.client_lib.protocol import codec
    from rlinkd.client_lib.transport import ServerError
    from rlinkd.shm.ring import StepRing

    def unavailable(*args):
        raise OSError(errno.ENOSYS, "memfd_create")
    address = f"unix://{inproc.listening.unix_socket}"
    with monkeypatch.context() as patch:
        patch.setattr(StepRing, "create_sealed", unavailable)
        with RLlinkClient(address) as client:
            with pytest.raises(ServerError, match="no shared-memory ring for this client"):
                client.request(codec.Attach(pid=os.getpid()), codec.Attached)
            with pytest.raises(ConnectionError):
                client.ping()
    stats = run_env(gym.make("CartPole-v1"), address, steps=400, seed=0)
    assert stats.steps == 400
