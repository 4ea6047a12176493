"""DQN against a real daemon (``rlinkd serve --set learner.algorithm=dqn``).

- Two client_lib CartPole clients (TCP and shared memory) learn to a mean return of 150
  within a test-sized budget, never waiting for an update.
- A checkpoint (SIGUSR1) holds the DQN state and, with ``checkpoint.save_replay``, the
  replay buffer: a restarted daemon resumes the weights version, the update count,
  epsilon's clock and the buffer's transitions.
- The RLlink seed client's message flow (EPISODES_AND_GET_STATE with plain JSON fragments,
  no extension keys read) keeps working under DQN.
"""
from __future__ import annotations

import signal
import time

import gymnasium as gym
import pytest

from tests.helpers import learn_over_both_transports, raw_recv, raw_send, wait_for

pytestmark = [pytest.mark.process, pytest.mark.timeout(420)]

DQN = ("--set", "learner.algorithm=dqn", "--set", "dqn.n_step=3", "--set", "dqn.lr=0.0023",
       "--set", "dqn.target_update_interval_updates=128", "--set", "dqn.epsilon_decay_steps=8000",
       "--set", "dqn.epsilon_end=0.04", "--set", "dqn.learning_starts_steps=1000")
SAVE_REPLAY = ("--set", "checkpoint.save_replay=true")
TARGET_RETURN = 150.0
LEARN_BUDGET_S = 240.0


def test_dqn_learns_cartpole_over_both_transports_and_resumes_from_a_checkpoint(daemon_factory):
    d = daemon_factory(*DQN, *SAVE_REPLAY)
    returns = learn_over_both_transports(d, TARGET_RETURN, LEARN_BUDGET_S)
    assert all(len(r) > 20 for r in returns.values()), "both transports took part"
    learner = d.status()["learner"]
    assert learner["algorithm"] == "dqn" and learner["updates"] > 0 and learner["epsilon"] < 0.5

    d.signal(signal.SIGUSR1)
    saved = wait_for(lambda: (s := d.status())["last_checkpoint"] and s, 30, what="a checkpoint")
    saved_learner = saved["learner"]
    assert d.stop() == 0
    d2 = daemon_factory(*DQN, *SAVE_REPLAY, name="state")  # same state dir: resumes it
    resumed = wait_for(lambda: (s := d2.status())["learner"].get("algorithm") and s, 60,
                       what="the resumed DQN learner")
    assert resumed["learner"]["replay_steps"] >= min(saved_learner["replay_steps"], 100_000) > 0
    assert resumed["learner"]["updates"] >= saved_learner["updates"] - 200  # (the checkpoint came first)
    assert resumed["learner"]["epsilon"] <= saved_learner["epsilon"] + 0.01
    assert resumed["weights_seq_no"] >= 1


@pytest.mark.parametrize("algorithm", ["dqn", "appo"])
def test_the_seed_clients_message_flow_works_under_off_policy_learners(daemon_factory, algorithm):
    """EPISODES_AND_GET_STATE with list-of-lists fragments, as the RLlink seed client sends:
    every reply is a SET_STATE at once (nobody waits for training), and the steps train
    (DQN: they fill the replay buffer; APPO: updates). SAC has no Discrete actions, so the
    seed client's CartPole is not its concern."""
    import socket
    d = daemon_factory(*(DQN if algorithm == "dqn" else ("--set", "learner.algorithm=appo")))
    sock = socket.create_connection(("127.0.0.1", d.port), timeout=30)
    raw_send(sock, {"type": "PING"})
    assert raw_recv(sock)["type"] == "PONG"
    raw_send(sock, {"type": "GET_CONFIG"})
    config = raw_recv(sock)
    assert config["type"] == "SET_CONFIG" and config["force_on_policy"] is False
    env = gym.make("CartPole-v1")
    for episode in range(30):
        obs, _ = env.reset(seed=episode)
        observations, actions, rewards = [obs.tolist()], [], []
        done = False
        while not done:
            action = int(env.action_space.sample())
            obs, reward, terminated, truncated, _ = env.step(action)
            observations.append(obs.tolist())
            actions.append(action)
            rewards.append(float(reward))
            done = terminated or truncated
        started = time.monotonic()
        raw_send(sock, {"type": "EPISODES_AND_GET_STATE", "env_steps": len(actions), "episodes": [{
            "obs": observations, "actions": actions, "rewards": rewards,
            "is_terminated": bool(terminated), "is_truncated": bool(truncated)}]})
        reply = raw_recv(sock)
        assert reply["type"] == "SET_STATE" and reply["onnx_file"], reply.get("message")
        assert time.monotonic() - started < 5.0
    sock.close()
    if algorithm == "dqn":
        wait_for(lambda: d.status()["learner"].get("replay_steps", 0) > 0, 20, what="replay filled")
    else:
        wait_for(lambda: d.status()["learner"].get("updates", 0) > 0, 20, what="an APPO update")
