"""Server-side actions against a real daemon (``rlinkd serve``).

- Raw-socket clients written from docs/serving.md alone (``socket`` + ``json`` through
  tests.helpers' raw functions, never client_lib) learn CartPole, one with the per-episode
  messages (START_EPISODE / GET_ACTION / LOG_RETURNS / STEP / END_EPISODE) after
  SERVE_DIRECT, one with STEP_BATCH without it (handed to the role at its first message).
- Serving connections (the inference role's): their episodes survive a collector restart,
  and a client outlives its idle control connection.
- client_lib ``inference="server"`` learns CartPole over TCP and over shared-memory lanes
  (one run, a client of each at once), versions only go up per client, and status
  ``inference`` reports what the role did.
- Every serving error reaches only the client that made it; another keeps getting actions.
- Evaluation episodes (client_lib ``mode="evaluate"``, raw ``training_enabled: false``)
  add nothing to env_steps or episodes, and are counted under ``eval``.
- No ACTIONS reply mixes weight versions, even when samples end every few batches.
- Server-inference clients survive a learner SIGKILL and a daemon restart (both transports).
- A client that floods requests and never reads does not hold up another.
"""
from __future__ import annotations

import os
import signal
import socket
import threading
import time

import gymnasium as gym
import numpy as np
import pytest

from rlinkd.client_lib import connect
from tests.helpers import BackgroundClient, concurrently, free_port, peer_closed, raw_recv, raw_send, wait_for

pytestmark = [pytest.mark.process, pytest.mark.timeout(240)]

TARGET_RETURN = 150.0
LEARN_BUDGET_S = 90.0   # each learning test needs ~5-15 s unloaded; generous for a busy machine
OBS = [0.01, 0.02, 0.03, 0.04]



def raw_client(port: int, direct: bool = False) -> socket.socket:
    """A connection after PING (and SERVE_DIRECT when ``direct``). TCP_NODELAY as docs/serving.md
    advises: without it a message with no reply (LOG_RETURNS, END_EPISODE) delays the next
    request by a delayed ACK."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    raw_send(sock, {"type": "PING"})
    assert raw_recv(sock)["type"] == "PONG"
    if direct:
        raw_send(sock, {"type": "SERVE_DIRECT"})
        assert raw_recv(sock)["type"] == "SERVE_DIRECT_READY"
    return sock


def request(sock: socket.socket, msg: dict, reply_type: str) -> dict:
    raw_send(sock, msg)
    reply = raw_recv(sock)
    assert reply["type"] == reply_type, (msg, reply)
    return reply


def solved(returns: list[float], window: int = 20) -> bool:
    return len(returns) >= window and float(np.mean(returns[-window:])) >= TARGET_RETURN


# ---------------------------------------------------------------- raw clients learn
def play_raw_episode(sock: socket.socket, env, episode_no: int, seqs: list[int]) -> float:
    """One CartPole episode with the per-episode messages: START_EPISODE, GET_ACTION, then
    STEP and LOG_RETURNS + GET_ACTION by turns; the end by END_EPISODE (even episodes) or a
    final STEP (odd ones). Records every ACTION's weights_seq_no in ``seqs``."""
    eid = f"ep-{episode_no}"
    started = request(sock, {"type": "START_EPISODE", "episode_id": eid}, "EPISODE_STARTED")
    assert started == {"type": "EPISODE_STARTED", "episode_id": eid, "policy_id": "default"}
    obs, _ = env.reset(seed=episode_no)
    reply = request(sock, {"type": "GET_ACTION", "episode_id": eid, "observation": obs.tolist()}, "ACTION")
    total, t = 0.0, 0
    while True:
        assert reply["episode_id"] == eid and reply["action"] in (0, 1), reply
        seqs.append(reply["weights_seq_no"])
        obs, reward, terminated, truncated, _ = env.step(reply["action"])
        total, t = total + reward, t + 1
        if terminated or truncated:
            break
        if t % 2:
            reply = request(sock, {"type": "STEP", "episode_id": eid, "reward": reward,
                                   "observation": obs.tolist()}, "ACTION")
        else:
            raw_send(sock, {"type": "LOG_RETURNS", "episode_id": eid, "reward": reward})
            reply = request(sock, {"type": "GET_ACTION", "episode_id": eid,
                                   "observation": obs.tolist()}, "ACTION")
    end = {"episode_id": eid, "observation": obs.tolist(), "terminated": terminated, "truncated": truncated}
    if episode_no % 2 == 0:
        raw_send(sock, {"type": "LOG_RETURNS", "episode_id": eid, "reward": reward})
        raw_send(sock, {"type": "END_EPISODE", **end})
    else:
        reply = request(sock, {"type": "STEP", "reward": reward, **end}, "ACTION")
        assert reply["action"] is None and reply["weights_seq_no"] == -1, reply
    return total


def test_a_raw_client_learns_cartpole_with_the_episode_messages(daemon):
    """Over a connection that asked for SERVE_DIRECT; the STEP_BATCH client below sends its
    serving messages without it (the role takes the connection at its first), and the
    wiring tests run every message both ways."""
    sock = raw_client(daemon.port, direct=True)
    env = gym.make("CartPole-v1")
    returns: list[float] = []
    seqs: list[int] = []
    deadline = time.monotonic() + LEARN_BUDGET_S
    while time.monotonic() < deadline and not solved(returns):
        returns.append(play_raw_episode(sock, env, len(returns), seqs))
    raw_send(sock, {"type": "PING"})  # END_EPISODE has no reply: an error would show here
    assert raw_recv(sock)["type"] == "PONG"
    sock.close()
    assert solved(returns), (len(returns), returns[-20:])
    assert seqs == sorted(seqs) and seqs[-1] > seqs[0] >= 0, "versions only go up"
    status = wait_for(lambda: (s := daemon.status())["episodes"] == len(returns) and s, 20,
                      what="every episode counted")
    assert status["env_steps"] == sum(returns) and status["protocol_errors"] == 0, status
    assert status["inference"]["direct_handed_over"] == 1


def test_serving_connections_are_told_when_the_daemon_stops(daemon_factory):
    """SIGTERM: a serving connection (the inference role's) gets the retryable
    "daemon shutting down" ERROR with the stop's reason, then its connection closes."""
    d = daemon_factory()
    sock = raw_client(d.port)
    request(sock, {"type": "START_EPISODE", "episode_id": "s"}, "EPISODE_STARTED")
    request(sock, {"type": "GET_ACTION", "episode_id": "s", "observation": OBS}, "ACTION")
    assert d.stop() == 0
    reply = raw_recv(sock)
    assert reply["type"] == "ERROR" and reply["message"].startswith("daemon shutting down: "), reply
    assert peer_closed(sock)
    sock.close()


def test_a_raw_client_learns_cartpole_with_step_batch_without_mixed_versions(daemon):
    """Plain socket + json: 8 CartPole copies, one STEP_BATCH per step; every reply carries one
    version, and versions only go up."""
    sock = raw_client(daemon.port)
    envs = [gym.make("CartPole-v1") for _ in range(8)]
    obs = [env.reset(seed=i)[0].tolist() for i, env in enumerate(envs)]
    ids = [f"env{i}-0" for i in range(8)]
    entries = [{"episode_id": ids[i], "observation": obs[i], "start": True} for i in range(8)]
    returns, running, episode_no, last_seq = [], [0.0] * 8, [0] * 8, -1
    deadline = time.monotonic() + LEARN_BUDGET_S
    while time.monotonic() < deadline and not solved(returns, 40):
        reply = request(sock, {"type": "STEP_BATCH", "steps": entries}, "ACTIONS")
        assert len(reply["actions"]) == len(reply["weights_seq_nos"]) == len(entries)
        versions = {s for a, s in zip(reply["actions"], reply["weights_seq_nos"]) if a is not None}
        assert len(versions) <= 1, f"one STEP_BATCH answered with versions {versions}"
        if versions:
            assert min(versions) >= last_seq, (last_seq, versions)
            last_seq = min(versions)
        entries = []
        for i, (env, action) in enumerate(zip(envs, reply["actions"])):
            if action is None:  # this copy's episode ended with the last batch: start the next
                assert reply["weights_seq_nos"][i] == -1
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
    assert solved(returns, 40), (len(returns), returns[-40:])
    assert last_seq >= 1


# ---------------------------------------------------------------- client_lib learns
def learn_served(agent, deadline: float) -> tuple[list[float], list[int]]:
    """``agent`` (server-side actions) plays CartPole until its own returns are solved or
    ``deadline``; (its episode returns, the weights_seq_no of every action)."""
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=0)
    returns, total, seqs = [], 0.0, []
    while time.monotonic() < deadline and not solved(returns):
        action = agent.act(obs)
        seqs.append(agent.weights_seq_no)
        obs, reward, terminated, truncated, _ = env.step(action)
        agent.step(reward, obs, terminated, truncated)
        total += reward
        if terminated or truncated:
            returns.append(total)
            total, (obs, _) = 0.0, env.reset()
    agent.close()
    return returns, seqs


def test_client_lib_server_inference_learns_cartpole(daemon):
    """One run, a TCP and a shared-memory-lanes (unix://) client at once, each until its
    own mean return reaches the target; versions only go up per client."""
    agents = {"tcp": connect(f"tcp://127.0.0.1:{daemon.port}", inference="server"),
              "unix": connect(f"unix://{daemon.unix_socket}", inference="server")}
    deadline = time.monotonic() + LEARN_BUDGET_S
    runs = concurrently({t: lambda a=a: learn_served(a, deadline) for t, a in agents.items()})
    for transport, (returns, seqs) in runs.items():
        assert solved(returns), (transport, len(returns), returns[-20:])
        assert seqs == sorted(seqs) and seqs[-1] > seqs[0] >= 0, (transport, "versions only go up")
        assert agents[transport].lost_episodes == 0, transport
    steps = sum(len(seqs) for _returns, seqs in runs.values())
    episodes = sum(len(returns) for returns, _seqs in runs.values())
    inference = wait_for(lambda: (i := daemon.status()["inference"]).get("actions", 0) >= steps and i,
                         20, what="the role's report")
    assert inference["requests"] >= inference["actions"] >= steps, inference
    assert inference["batches"] >= 1 and sum(inference["batch_sizes"].values()) == inference["batches"]
    assert set(inference["backends"]["default"].split("/")) <= {"native", "numpy", "onnxruntime", "torch"}, inference
    last_seq = max(seqs[-1] for _returns, seqs in runs.values())
    assert inference["errors"] == 0 and inference["weights_seq_nos"]["default"] >= last_seq, inference
    status = wait_for(lambda: (s := daemon.status())["episodes"] >= episodes and s, 20,
                      what="every episode counted")
    assert status["env_steps"] == steps and status["episodes"] == episodes, status


def learn_vector(client, deadline: float, returns: list[float], killed: threading.Event):
    """``client`` (8 CartPoles, server-side actions) until ``killed`` is set, more than 60
    of its episodes ended and the last 20 are solved, or ``deadline``; its run_env stats
    (every episode's return into ``returns``)."""
    from rlinkd.client_lib.runner import run_env
    env = gym.make_vec("CartPole-v1", num_envs=8, vectorization_mode="sync",
                       vector_kwargs={"autoreset_mode": "SameStep"})
    stats = run_env(env, client, seed=0, on_episode=lambda _stats, r: returns.append(r),
                    should_stop=lambda _s: time.monotonic() > deadline or (
                        killed.is_set() and len(returns) > 60 and solved(returns)))
    client.close()
    return stats


def test_a_vector_client_learns_cartpole_and_survives_an_inference_restart(daemon):
    """connect_vector(..., inference="server") over TCP (one STEP_BATCH per act) and over
    shared-memory lanes (unix://, one request group per act), both in one run: a SIGKILL of
    the inference role once each has ended 30 episodes costs each only the episodes in
    progress, then each learns on to mean return 150."""
    from rlinkd.client_lib.multi import connect_vector
    clients = {"tcp": connect_vector(f"tcp://127.0.0.1:{daemon.port}", 8, inference="server"),
               "unix": connect_vector(f"unix://{daemon.unix_socket}", 8, inference="server")}
    returns: dict[str, list[float]] = {t: [] for t in clients}
    killed = threading.Event()
    deadline = time.monotonic() + LEARN_BUDGET_S

    def kill_the_role_mid_run() -> int:
        wait_for(lambda: min(len(r) for r in returns.values()) >= 30, LEARN_BUDGET_S,
                 what="30 episodes of each client")
        pid = daemon.status()["children"]["inference"]["pid"]
        os.kill(pid, signal.SIGKILL)  # the role dies with every lane's episode
        killed.set()
        return pid

    runs = concurrently({"kill": kill_the_role_mid_run} | {
        t: lambda t=t, c=c: learn_vector(c, deadline, returns[t], killed) for t, c in clients.items()})
    for transport, client in clients.items():
        assert solved(returns[transport]), (transport, len(returns[transport]), returns[transport][-20:])
        assert client.lost_episodes >= 1 and runs[transport].steps > 0, transport
    status = daemon.status()
    assert status["children"]["inference"]["pid"] != runs["kill"] and status["children"]["inference"]["alive"]


# ---------------------------------------------------------------- errors
def start(sock: socket.socket, eid: str) -> None:
    request(sock, {"type": "START_EPISODE", "episode_id": eid}, "EPISODE_STARTED")


def act(sock: socket.socket, eid: str, obs=OBS) -> dict:
    return request(sock, {"type": "GET_ACTION", "episode_id": eid, "observation": obs}, "ACTION")


def ended_episode(sock: socket.socket) -> None:
    start(sock, "a")
    act(sock, "a")
    assert request(sock, {"type": "STEP", "episode_id": "a", "reward": 1.0, "observation": OBS,
                          "terminated": True}, "ACTION")["action"] is None


MAX_EPISODES = 4
# (name, setup on a fresh connection, the bad message, a fragment of the ERROR's text)
ERROR_CASES = [
    ("unknown id", None, {"type": "GET_ACTION", "episode_id": "nope", "observation": OBS}, "unknown episode"),
    ("unknown id, LOG_RETURNS", None, {"type": "LOG_RETURNS", "episode_id": "nope", "reward": 1.0},
     "unknown episode"),
    ("unknown id, END_EPISODE", None, {"type": "END_EPISODE", "episode_id": "nope", "observation": OBS},
     "unknown episode"),
    ("ended id", ended_episode, {"type": "STEP", "episode_id": "a", "reward": 1.0, "observation": OBS},
     "already ended"),
    ("ended id restarted", ended_episode, {"type": "START_EPISODE", "episode_id": "a"}, "already ended"),
    ("id twice", lambda s: start(s, "a"), {"type": "START_EPISODE", "episode_id": "a"}, "already open"),
    ("wrong shape", lambda s: start(s, "a"), {"type": "GET_ACTION", "episode_id": "a", "observation": [1.0]},
     "observation"),
    ("not numbers", lambda s: start(s, "a"),
     {"type": "GET_ACTION", "episode_id": "a", "observation": ["x", "y", "z", "w"]}, "observation"),
    ("step first", lambda s: start(s, "a"),
     {"type": "STEP", "episode_id": "a", "reward": 1.0, "observation": OBS}, "first action"),
    ("too many", lambda s: [start(s, f"e{i}") for i in range(MAX_EPISODES)],
     {"type": "START_EPISODE", "episode_id": "one-more"}, "max_agents_per_connection"),
    ("batch: unknown", None, {"type": "STEP_BATCH", "steps": [
        {"episode_id": "nope", "observation": OBS, "reward": 1.0}]}, "unknown episode"),
    ("batch: ended", ended_episode, {"type": "STEP_BATCH", "steps": [
        {"episode_id": "a", "observation": OBS, "reward": 1.0}]}, "already ended"),
    ("batch: step first", lambda s: start(s, "a"), {"type": "STEP_BATCH", "steps": [
        {"episode_id": "a", "observation": OBS, "reward": 1.0}]}, "first action"),
    ("batch: id twice", None, {"type": "STEP_BATCH", "steps": [
        {"episode_id": "b", "observation": OBS, "start": True},
        {"episode_id": "b", "observation": OBS, "start": True}]}, "twice"),
    ("batch: start with reward", None, {"type": "STEP_BATCH", "steps": [
        {"episode_id": "b", "observation": OBS, "start": True, "reward": 1.0}]}, "no reward"),
    ("batch: step without reward", lambda s: (start(s, "a"), act(s, "a")), {"type": "STEP_BATCH", "steps": [
        {"episode_id": "a", "observation": OBS}]}, "reward"),
    ("batch: empty", None, {"type": "STEP_BATCH", "steps": []}, "1 to"),
    ("batch: bad observation after a good start", None, {"type": "STEP_BATCH", "steps": [
        {"episode_id": "b", "observation": OBS, "start": True},
        {"episode_id": "c", "observation": [1.0, 2.0], "start": True}]}, "observation"),
    ("batch: too many", None, {"type": "STEP_BATCH", "steps": [
        {"episode_id": f"b{i}", "observation": OBS, "start": True} for i in range(MAX_EPISODES + 1)]},
     "max_agents_per_connection"),
    ("batch: id already open", lambda s: start(s, "a"), {"type": "STEP_BATCH", "steps": [
        {"episode_id": "a", "observation": OBS, "start": True}]}, "already open"),
]


def test_every_serving_error_reaches_only_that_client(daemon_factory):
    """Each case on its own connection: ERROR naming the problem, then that connection is
    closed; a calm client's episode goes on between the cases; every lane comes back."""
    d = daemon_factory("--set", f"server.max_agents_per_connection={MAX_EPISODES}")
    calm = raw_client(d.port)
    start(calm, "calm")
    act(calm, "calm")
    for name, setup, bad, fragment in ERROR_CASES:
        sock = raw_client(d.port)
        if setup is not None:
            setup(sock)
        raw_send(sock, bad)
        reply = raw_recv(sock)
        assert reply["type"] == "ERROR" and fragment in reply["message"], (name, reply)
        assert peer_closed(sock), name
        sock.close()
        step = request(calm, {"type": "STEP", "episode_id": "calm", "reward": 1.0, "observation": OBS},
                       "ACTION")
        assert step["action"] in (0, 1), (name, step)
    status = wait_for(lambda: (s := d.status())["protocol_errors"] >= len(ERROR_CASES) and s, 20,
                      what="errors counted")
    assert status["protocol_errors"] == len(ERROR_CASES), status["protocol_errors_by_kind"]
    try:
        wait_for(lambda: (i := d.status()["inference"])["tcp_episodes_open"] == 1 and i["lanes_open"] == 1,
                 20, what="only the calm client's episode open")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {d.status()['inference']}") from None
    calm.close()
    try:
        wait_for(lambda: d.status()["inference"]["lanes_open"] == 0, 20, what="every lane released")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {d.status()['inference']}") from None


# ---------------------------------------------------------------- evaluation episodes
def served_episodes(address: str, n: int, mode: str) -> int:
    """``n`` CartPole episodes with a server-inference agent; their total steps."""
    agent = connect(address, inference="server", mode=mode)
    env = gym.make("CartPole-v1")
    steps = 0
    for episode in range(n):
        obs, _ = env.reset(seed=episode)
        done = False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(agent.act(obs))
            agent.step(reward, obs, terminated, truncated)
            steps, done = steps + 1, terminated or truncated
    agent.close()
    return steps


def raw_eval_episodes(port: int) -> int:
    """3 evaluation episodes by START_EPISODE training_enabled=false (one also checks the
    action is greedy: the same observation 20 times, the same action), and 4 as STEP_BATCH
    entries; returns the number of episodes."""
    sock = raw_client(port)
    for k in range(3):
        eid = f"eval-{k}"
        request(sock, {"type": "START_EPISODE", "episode_id": eid, "training_enabled": False}, "EPISODE_STARTED")
        actions = {act(sock, eid, [0.0, 0.1 * k, 0.0, -0.1])["action"] for _ in range(20)}
        assert len(actions) == 1, f"an evaluation episode sampled {actions}"
        assert request(sock, {"type": "STEP", "episode_id": eid, "reward": 1.0, "observation": OBS,
                              "truncated": True}, "ACTION")["action"] is None
    ids = [f"b{i}" for i in range(4)]
    request(sock, {"type": "STEP_BATCH", "steps": [
        {"episode_id": e, "observation": OBS, "start": True, "training_enabled": False} for e in ids]}, "ACTIONS")
    request(sock, {"type": "STEP_BATCH", "steps": [
        {"episode_id": e, "observation": OBS, "reward": 1.0} for e in ids]}, "ACTIONS")
    reply = request(sock, {"type": "STEP_BATCH", "steps": [
        {"episode_id": e, "observation": OBS, "reward": 1.0, "terminated": True} for e in ids]}, "ACTIONS")
    assert reply["actions"] == [None] * 4
    sock.close()
    return 7


def test_evaluation_episodes_contribute_no_training_data(shared_daemon):
    """Training episodes first (3 on one TCP connection, then 10 shared-memory connections of
    one episode each, closed right after the episode's END: every step counts), then
    evaluation episodes of every kind: the training counters do not move (counted from
    ``before``: the module's daemon is shared with the flooding test)."""
    daemon = shared_daemon
    before = daemon.status()
    actions_before = before["inference"].get("actions", 0)
    policy_steps = before["policies"]["default"]["env_steps"]
    episodes, eval_before = before["episodes"] + 13, before["eval"].get("episodes", 0)
    train_steps = served_episodes(f"tcp://127.0.0.1:{daemon.port}", 3, "train")
    train_steps += sum(served_episodes(f"unix://{daemon.unix_socket}", 1, "train") for _ in range(10))
    status = wait_for(lambda: (s := daemon.status())["episodes"] == episodes and s, 20,
                      what="13 training episodes")
    assert status["env_steps"] == before["env_steps"] + train_steps, (before, status)
    eval_episodes = eval_before + raw_eval_episodes(daemon.port) + 8
    eval_steps = served_episodes(f"tcp://127.0.0.1:{daemon.port}", 4, "evaluate")
    eval_steps += served_episodes(f"unix://{daemon.unix_socket}", 4, "evaluate")
    status = wait_for(lambda: (s := daemon.status())["eval"].get("episodes", 0) >= eval_episodes
                      and s["inference"]["actions"] >= actions_before + train_steps + eval_steps and s,
                      30, what="evaluation episodes and the role's actions reported")
    assert status["eval"]["episodes"] == eval_episodes, status["eval"]
    assert status["env_steps"] == before["env_steps"] + train_steps, (before, status)
    assert status["episodes"] == episodes, (before, status)
    assert status["policies"]["default"]["env_steps"] == policy_steps + train_steps, status["policies"]
    assert eval_steps > 8, eval_steps
    assert status["inference"]["actions"] >= actions_before + train_steps + eval_steps, status["inference"]


# ---------------------------------------------------------------- versions never mix
def test_step_batch_replies_never_mix_versions_at_sample_boundaries(daemon_factory):
    """A sample ends every 2 batches (64 steps, 32 entries per batch) and the role batches
    nothing (max_wait_us=0), so batches split across versions if anything lets them; a second
    client's requests interleave. Every ACTIONS reply still carries one version."""
    d = daemon_factory("--set", "inference.env_steps_per_sample=64", "--set", "inference.max_wait_us=0",
                       "--set", "sampling.train_batch_size=64", "--set", "ppo.minibatch_size=64",
                       "--set", "ppo.num_epochs=1")
    other = BackgroundClient(f"tcp://127.0.0.1:{d.port}", inference="server").start()
    sock = raw_client(d.port)
    ids = [f"x{i}" for i in range(32)]
    rng = np.random.default_rng(0)
    request(sock, {"type": "STEP_BATCH", "steps": [{"episode_id": e, "observation": OBS, "start": True}
                                                  for e in ids]}, "ACTIONS")
    seen, last = set(), -1
    try:
        for _ in range(300):
            steps = [{"episode_id": e, "observation": rng.uniform(-0.05, 0.05, 4).tolist(), "reward": 1.0}
                     for e in ids]
            seqs = request(sock, {"type": "STEP_BATCH", "steps": steps}, "ACTIONS")["weights_seq_nos"]
            assert len(set(seqs)) == 1, f"one STEP_BATCH answered with versions {sorted(set(seqs))}"
            assert seqs[0] >= last, (last, seqs[0])
            last = seqs[0]
            seen.add(last)
    finally:
        other.stop()
        sock.close()
    assert other.error is None, repr(other.error)
    assert len(seen) >= 20, sorted(seen)  # the run crossed many versions


# ---------------------------------------------------------------- restarts
def test_server_inference_survives_a_learner_and_a_daemon_restart(daemon_factory):
    """A TCP and a shared-memory server-inference client at once, through a learner SIGKILL
    and a daemon restart (same port, same state dir): each keeps stepping after each."""
    port = free_port()
    d = daemon_factory("--port", str(port))
    clients = [BackgroundClient(f"tcp://127.0.0.1:{port}", inference="server").start(),
               BackgroundClient(f"shm:{d.state_dir}", seed=1, inference="server").start()]

    def each_steps_on(what: str, timeout_s: float) -> None:
        steps = [c.steps for c in clients]
        wait_for(lambda: all(c.steps > s + 500 or c.error for c, s in zip(clients, steps)),
                 timeout_s, what=f"500 more steps of each client {what} (from {steps})")

    each_steps_on("at first", 60)
    learner = d.status()["children"]["learner"]["pid"]
    os.kill(learner, signal.SIGKILL)
    wait_for(lambda: (c := d.status()["children"]["learner"])["alive"] and c["pid"] != learner,
             60, what="learner restarted")
    each_steps_on("after the learner restart", 60)
    assert d.stop() == 0
    d2 = daemon_factory("--port", str(port), name="state")  # same state dir, same port
    each_steps_on("after the daemon restart", 90)
    for client in clients:
        client.stop()
    for client in clients:
        assert client.error is None, (client.address, repr(client.error))
        assert client.agent.lost_episodes >= 1, client.address
    assert d2.status()["inference"].get("actions", 0) > 0 or wait_for(
        lambda: d2.status()["inference"].get("actions", 0) > 0, 10, what="actions reported")


def test_direct_episodes_survive_a_collector_restart(daemon):
    """A direct connection belongs to the inference role: the collector's restart loses no
    episode of it (its steps are held until the role's link to the new collector is up)."""
    sock = raw_client(daemon.port, direct=True)
    request(sock, {"type": "START_EPISODE", "episode_id": "d"}, "EPISODE_STARTED")
    request(sock, {"type": "GET_ACTION", "episode_id": "d", "observation": OBS}, "ACTION")
    collector = daemon.status()["children"]["collector"]["pid"]
    os.kill(collector, signal.SIGKILL)

    def restarted() -> bool:
        try:  # (the status connection itself may hit the dying collector)
            c = daemon.status()["children"]["collector"]
        except (ConnectionError, OSError):
            return False
        return c["alive"] and c["pid"] != collector
    wait_for(restarted, 60, what="collector restarted")
    for _ in range(5):
        reply = request(sock, {"type": "STEP", "episode_id": "d", "reward": 1.0, "observation": OBS}, "ACTION")
        assert reply["action"] in (0, 1)
    sock.close()


def test_a_direct_client_outlives_its_idle_control_connection(daemon_factory):
    """client_lib's first connection carries only METRICS once serving goes direct: when the
    daemon closes it as idle, the next metric reopens it alone, and the episode goes on."""
    d = daemon_factory("--set", "server.idle_timeout_s=1")
    agent = connect(f"tcp://127.0.0.1:{d.port}", inference="server")
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=0)
    until = time.monotonic() + 3.0  # (the control connection idles past 1 s meanwhile)
    while time.monotonic() < until:
        obs2, r, term, trunc, _ = env.step(agent.act(obs))
        agent.step(r, obs2, term, trunc)
        obs = env.reset()[0] if term or trunc else obs2
        time.sleep(0.002)
    agent.log_metric("idle/probe", 1.0)
    agent.metrics.flush()
    for _ in range(50):
        obs2, r, term, trunc, _ = env.step(agent.act(obs))
        agent.step(r, obs2, term, trunc)
        obs = env.reset()[0] if term or trunc else obs2
    assert agent.lost_episodes == 0 and agent.link.generation == 1
    agent.close()
    wait_for(lambda: "idle/probe" in d.status()["client_metrics"], 10, what="the metric reported")


# ---------------------------------------------------------------- flooding
def flood(port: int, stop: threading.Event, sent: list[int]) -> None:
    """Send STEP_BATCHes of 16 episodes as fast as the socket takes them, never reading a
    reply, until ``stop`` (a send that blocks for a second just tries again)."""
    sock = raw_client(port)
    ids = [f"f{i}" for i in range(16)]
    raw_send(sock, {"type": "STEP_BATCH", "steps": [{"episode_id": e, "observation": OBS, "start": True}
                                                    for e in ids]})
    batch = {"type": "STEP_BATCH", "steps": [{"episode_id": e, "observation": OBS, "reward": 1.0} for e in ids]}
    sock.settimeout(1.0)
    try:
        while not stop.is_set():
            raw_send(sock, batch)
            sent[0] += 1
    except (TimeoutError, ConnectionError):  # its buffers are full (or the daemon gave up on it)
        stop.wait()
    finally:
        sock.close()


@pytest.mark.serial
def test_a_flooding_client_does_not_hold_up_another(shared_daemon):
    """One raw client floods STEP_BATCHes and never reads a reply; another client's actions
    keep coming: its p99 latency over 300 steps during the flood stays bounded."""
    daemon = shared_daemon
    actions_before = daemon.status()["inference"].get("actions", 0)
    calm = raw_client(daemon.port)
    start(calm, "calm")
    act(calm, "calm")
    stop, sent = threading.Event(), [0]
    flooder = threading.Thread(target=flood, args=(daemon.port, stop, sent), daemon=True)
    flooder.start()
    wait_for(lambda: sent[0] >= 50, 30, what="the flood under way")
    latencies = []
    try:
        for _ in range(300):
            t0 = time.perf_counter()
            reply = request(calm, {"type": "STEP", "episode_id": "calm", "reward": 1.0, "observation": OBS},
                            "ACTION")
            latencies.append(time.perf_counter() - t0)
            assert reply["action"] in (0, 1)
    finally:
        stop.set()
        flooder.join(10)
    calm.close()
    p50, p99 = np.percentile(latencies, [50, 99])
    flooded = wait_for(lambda: (a := daemon.status()["inference"].get("actions", 0))
                       > actions_before + 16 * 50 and a,
                       15, what="the flooder's batches served (the role reports once a second)")
    assert flooded and sent[0] >= 50, (flooded, sent)
    assert p99 < 0.25, (p50, p99, sent[0])
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


def test_a_client_that_scribbles_its_lane_header_is_closed_not_the_role(daemon):
    """An area whose header its client overwrote is refused when a restarted inference role
    maps it again: the collector closes that client (which reconnects with a fresh area);
    the role does not crash-loop on it."""
    agent = connect(f"unix://{daemon.unix_socket}", inference="server")
    obs = np.zeros(4, np.float32)
    agent.act(obs)
    agent.link.area.segment.buf[8:12] = (99).to_bytes(4, "little")  # layout_version
    before = daemon.status()["children"]["inference"]
    os.kill(before["pid"], signal.SIGKILL)
    wait_for(lambda: all(e in daemon.log() for e in ("inference_area_refused", "shm_action_client_refused")),
             30, what="the refusal")
    agent.act(obs)  # (a new connection, a new area)
    assert int.from_bytes(agent.link.area.segment.buf[8:12], "little") == 3
    time.sleep(1.0)  # (a crash loop would show as more restarts within a second)
    after = daemon.status()["children"]["inference"]
    assert after["alive"] and after["restarts"] == before["restarts"] + 1, after
    agent.close()
