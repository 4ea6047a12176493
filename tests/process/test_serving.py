"""Server-side actions against a real daemon: a raw-socket client written from the README
alone learns CartPole; server-inference clients survive a learner restart and a daemon
restart; a client that floods requests and never reads does not hold up another."""
from __future__ import annotations

import os
import signal
import socket
import time

import gymnasium as gym
import numpy as np
import pytest

from tests.helpers import BackgroundClient, raw_recv, raw_send, wait_for

pytestmark = pytest.mark.timeout(240)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def raw_client(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    raw_send(sock, {"type": "PING"})
    assert raw_recv(sock)["type"] == "PONG"
    return sock


def test_a_raw_socket_client_learns_cartpole_with_step_batch(daemon):
    """Plain socket + json (no client_lib): 8 CartPole copies, one STEP_BATCH per step."""
    sock = raw_client(daemon.port)
    envs = [gym.make("CartPole-v1") for _ in range(8)]
    obs = [env.reset(seed=i)[0].tolist() for i, env in enumerate(envs)]
    ids = [f"env{i}-0" for i in range(8)]
    entries = [{"episode_id": ids[i], "observation": obs[i], "start": True} for i in range(8)]
    returns, running, episode_no = [], [0.0] * 8, [0] * 8
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline and (len(returns) < 40 or np.mean(returns[-40:]) < 150):
        raw_send(sock, {"type": "STEP_BATCH", "steps": entries})
        reply = raw_recv(sock)
        assert reply["type"] == "ACTIONS", reply
        entries = []
        for i, (env, action) in enumerate(zip(envs, reply["actions"])):
            if action is None:  # this copy's episode ended with the last batch: start the next
                episode_no[i] += 1
                ids[i] = f"env{i}-{episode_no[i]}"
                obs[i] = env.reset()[0].tolist()
                entries.append({"episode_id": ids[i], "observation": obs[i], "start": True})
                continue
            o, r, term, trunc, _ = env.step(action)
            running[i] += r
            entries.append({"episode_id": ids[i], "observation": o.tolist(), "reward": r,
                            "terminated": term, "truncated": trunc})
            if term or trunc:
                returns.append(running[i])
                running[i] = 0.0
    sock.close()
    assert len(returns) >= 40 and np.mean(returns[-40:]) >= 150, (len(returns), returns[-40:])


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_server_inference_survives_a_learner_and_a_daemon_restart(daemon_factory, transport):
    port = free_port()
    d = daemon_factory("--port", str(port))
    address = f"tcp://127.0.0.1:{port}" if transport == "tcp" else f"shm:{d.state_dir}"
    client = BackgroundClient(address, inference="server").start()
    wait_for(lambda: client.steps > 500 or client.error, 60, what="serving")
    learner = d.status()["children"]["learner"]["pid"]
    os.kill(learner, signal.SIGKILL)
    wait_for(lambda: (c := d.status()["children"]["learner"])["alive"] and c["pid"] != learner,
             60, what="learner restarted")
    steps = client.steps
    wait_for(lambda: client.steps > steps + 500 or client.error, 60, what="steps after the learner restart")
    assert d.stop() == 0
    steps = client.steps
    d2 = daemon_factory("--port", str(port), name="state")  # same state dir, same port
    wait_for(lambda: client.steps > steps + 500 or client.error, 90, what="steps after the daemon restart")
    client.stop()
    assert client.error is None, repr(client.error)
    assert client.agent.lost_episodes >= 1
    assert d2.status()["inference"].get("actions", 0) > 0 or wait_for(
        lambda: d2.status()["inference"].get("actions", 0) > 0, 10, what="actions reported")


def test_a_flooding_client_does_not_hold_up_another(daemon):
    """One raw client sends 200 STEP_BATCHes of 4 episodes without reading a reply; another
    client's actions keep coming (its p99 stays far below the flooder's backlog)."""
    flooder = raw_client(daemon.port)
    flood_ids = [f"f{i}" for i in range(4)]
    obs = [0.01, 0.02, 0.03, 0.04]
    raw_send(flooder, {"type": "STEP_BATCH", "steps": [{"episode_id": e, "observation": obs, "start": True}
                                                      for e in flood_ids]})
    calm = raw_client(daemon.port)
    raw_send(calm, {"type": "START_EPISODE", "episode_id": "calm"})
    assert raw_recv(calm)["type"] == "EPISODE_STARTED"
    raw_send(calm, {"type": "GET_ACTION", "episode_id": "calm", "observation": obs})
    assert raw_recv(calm)["type"] == "ACTION"
    flooder.setblocking(False)
    batch = {"type": "STEP_BATCH", "steps": [{"episode_id": e, "observation": obs, "reward": 1.0}
                                             for e in flood_ids]}
    sent = 0
    latencies = []
    for _ in range(300):
        try:
            if sent < 200:
                raw_send(flooder, batch)
                sent += 1
        except BlockingIOError:
            pass
        t0 = time.perf_counter()
        raw_send(calm, {"type": "STEP", "episode_id": "calm", "reward": 1.0, "observation": obs})
        reply = raw_recv(calm)
        latencies.append(time.perf_counter() - t0)
        assert reply["type"] == "ACTION" and reply["action"] in (0, 1)
    flooder.close()
    calm.close()
    assert np.percentile(latencies, 99) < 0.25, np.percentile(latencies, [50, 99])
    wait_for(lambda: daemon.status()["connections"] == 1, 30, what="both closed (1: this query)")
    wait_for(lambda: daemon.status()["inference"]["lanes_open"] == 0, 30,
             what="the flooder's lanes released")


@pytest.mark.parametrize("inference", ["client", "server"])
def test_evaluation_returns_and_client_metrics_reach_tensorboard(daemon_factory, inference):
    from rlinkd.client_lib import connect
    from tests.process.test_supervision import tensorboard_tags_by_step
    d = daemon_factory("--set", "daemon.status_interval_s=0.2")
    transport = f"tcp://127.0.0.1:{d.port}" if inference == "client" else f"shm:{d.state_dir}"
    agent = connect(transport, inference=inference, mode="evaluate")
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=3)
    for _ in range(3):
        done = False
        while not done:
            obs2, r, term, trunc, _ = env.step(agent.act(obs))
            agent.step(r, obs2, term, trunc)
            obs, done = obs2, term or trunc
        obs, _ = env.reset()
        agent.log_metric("sim/fps", 120.0)
    agent.close()
    wanted = {"eval/episode_return_mean", "eval/episode_len_mean", "eval/episodes", "client/sim/fps"}
    tags = wait_for(lambda: (t := set().union(*tensorboard_tags_by_step(d.state_dir).values() or [set()]))
                    >= wanted and t, 30, what="eval/* and client/* tags in the event file")
    assert wanted <= tags
    assert d.status()["env_steps"] == 0  # evaluation trained nothing
