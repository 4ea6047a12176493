"""Real-process tests of the core daemon: protocol semantics, many clients, processes."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading

import gymnasium as gym
import psutil
import pytest

from rlinkd.client_lib import run_env
from tests.helpers import REPO, raw_connect, raw_recv, raw_send, wait_for

pytestmark = pytest.mark.process


def handshake(port: int) -> socket.socket:
    sock = raw_connect(port)
    raw_send(sock, {"type": "PING"})
    assert raw_recv(sock)["type"] == "PONG"
    return sock


def fragment(obs, actions, terminated=False, truncated=False):
    return {"obs": obs, "actions": actions, "rewards": [1.0] * len(actions),
            "is_terminated": terminated, "is_truncated": truncated}


def test_fragment_continuation_counts_one_episode(daemon):
    sock = handshake(daemon.port)
    a = [[0.0, 0.0, 0.0, 0.0], [0.1, 0.0, 0.0, 0.0], [0.2, 0.0, 0.0, 0.0]]
    b = [[0.2, 0.0, 0.0, 0.0], [0.3, 0.0, 0.0, 0.0]]  # first obs repeats a's last
    raw_send(sock, {"type": "EPISODES", "episodes": [fragment(a, [1, 1])], "timesteps": 2})
    raw_send(sock, {"type": "EPISODES", "episodes": [fragment(b, [0], terminated=True)],
                    "env_steps": 1})
    status = wait_for(lambda: (s := daemon.status())["episodes"] == 1 and s, 10, what="episode")
    assert status["env_steps"] == 3
    assert status["episode_return_mean"] == pytest.approx(3.0)


def test_off_policy_replies_at_once_with_newest_weights(daemon_factory):
    d = daemon_factory("--set", "sampling.force_on_policy=false",
                       "--set", "sampling.train_batch_size=100000",
                       "--set", "ppo.minibatch_size=64")
    sock = handshake(d.port)
    raw_send(sock, {"type": "GET_CONFIG"})
    assert raw_recv(sock)["force_on_policy"] is False
    obs = [[0.0, 0.0, 0.0, 0.0], [0.1, 0.0, 0.0, 0.0]]
    raw_send(sock, {"type": "EPISODES_AND_GET_STATE", "episodes": [fragment(obs, [1])]})
    reply = raw_recv(sock)  # no batch can fill (100k steps) and yet we are answered
    assert reply["type"] == "SET_STATE" and reply["weights_seq_no"] == 0


def test_64_clients_at_once_each_with_own_state(shared_daemon):
    daemon = shared_daemon
    before = daemon.status()
    n, results, errors = 64, {}, []

    def client(i: int) -> None:
        try:
            sock = handshake(daemon.port)
            obs = [[0.01 * i, 0.0, 0.0, 0.0], [0.01 * i, 0.1, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]
            raw_send(sock, {"type": "EPISODES_AND_GET_STATE",
                            "episodes": [fragment(obs, [i % 2, 1], terminated=True)]})
            results[i] = raw_recv(sock)
            sock.close()
        except Exception as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(f"client {i}: {exc!r}")

    threads = [threading.Thread(target=client, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert len(results) == n and all(r["type"] == "SET_STATE" for r in results.values())
    trained = min(r["weights_seq_no"] for r in results.values())
    assert trained > before["weights_seq_no"], (before, trained)  # trained on their data
    status = daemon.status()
    assert status["env_steps"] == before["env_steps"] + 2 * n, (before, status)
    assert status["episodes"] == before["episodes"] + n, (before, status)


def test_only_learner_and_checkpointer_load_torch(shared_daemon):
    status = shared_daemon.status()
    children = {role: info["pid"] for role, info in status["children"].items()}
    assert set(children) == {"collector", "connector", "learner", "checkpointer", "inference"}

    def has_torch(pid: int) -> bool:
        return any("libtorch" in m.path for m in psutil.Process(pid).memory_maps())

    assert not has_torch(children["collector"])
    assert not has_torch(children["connector"])
    assert not has_torch(children["inference"])  # numpy/onnxruntime unless a GPU asks for torch
    assert has_torch(children["learner"])


def test_sigterm_writes_final_checkpoint_and_exits_cleanly(daemon):
    sock = handshake(daemon.port)
    sock.close()
    assert daemon.stop() == 0
    ckpts = list((daemon.state_dir / "checkpoints").glob("ckpt-*/manifest.json"))
    assert len(ckpts) == 1
    assert not (daemon.state_dir / "daemon.json").exists()


def test_import_client_lib_does_not_load_torch():
    code = ("import sys, rlinkd.client_lib, rlinkd.client_lib.agent, rlinkd.client_lib.runner, "
            "rlinkd.client_lib.policy; from rlinkd.client_lib import connect, run_env;"
            "assert 'torch' not in sys.modules, 'torch loaded';"
            "assert not any(m.startswith('rlinkd.daemon') for m in sys.modules), 'daemon loaded'")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_rlinkd_status_reports_the_contract_keys_as_json_and_text(shared_daemon):
    daemon = shared_daemon
    before = daemon.status()
    stats = run_env(gym.make("CartPole-v1"), f"tcp://127.0.0.1:{daemon.port}", steps=600, seed=2)
    steps, episodes = before["env_steps"] + 600, before["episodes"] + stats.episodes
    wait_for(lambda: daemon.status()["env_steps"] == steps, 10, what="steps counted")
    cli = [sys.executable, "-m", "rlinkd.daemon.cli", "status", "--state-dir", str(daemon.state_dir)]
    as_json = subprocess.run([*cli, "--json"], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert as_json.returncode == 0, as_json.stderr
    status = json.loads(as_json.stdout)
    required = ("env_steps", "episodes", "episode_return_mean", "weights_seq_no", "clients",
                "dropped_episodes", "protocol_errors", "uptime_s")
    assert set(required) <= set(status), set(required) - set(status)
    assert status["env_steps"] == steps and status["episodes"] == episodes
    assert status["weights_seq_no"] > before["weights_seq_no"] and status["uptime_s"] > 0
    assert status["dropped_episodes"] == before["dropped_episodes"]
    assert status["protocol_errors"] == before["protocol_errors"]
    text = subprocess.run(cli, capture_output=True, text=True, timeout=60, cwd=REPO)
    assert text.returncode == 0, text.stderr
    assert f"env_steps {steps}" in text.stdout and f"episodes {episodes}" in text.stdout
    assert f"protocol_errors {before['protocol_errors']}" in text.stdout and "learner" in text.stdout
