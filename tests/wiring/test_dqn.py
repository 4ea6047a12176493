"""DQN through the whole daemon in one process: its clients never wait for training (on
both transports), the replay buffer fills, the learner trains while they sample and
publishes every few updates, epsilon reaches the clients in SET_STATE / WEIGHTS_READY and
falls, status reports the DQN learner."""
from __future__ import annotations

import time

import gymnasium as gym
import pytest

from rlinkd.client_lib import connect
from rlinkd.client_lib.transport import RLlinkClient
from rlinkd.daemon.config import load_config
from rlinkd.daemon.inprocess import InProcessDaemon
from rlinkd.daemon.roster import ROLES
from tests.helpers import wait_for


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dqn")
    cfg = load_config(None, [("daemon", "state_dir", str(tmp / "state")), ("server", "port", 0),
                             ("learner", "algorithm", "dqn"), ("sampling", "env_steps_per_sample", 100),
                             ("dqn", "learning_starts_steps", 200), ("dqn", "updates_per_step", 0.25),
                             ("dqn", "publish_interval_updates", 10), ("dqn", "epsilon_decay_steps", 2000),
                             ("dqn", "hidden_sizes", [32, 32])])
    d = InProcessDaemon(cfg).start()
    yield d
    assert d.stop() == {role: 0 for role in ROLES}


def status(daemon) -> dict:
    with RLlinkClient(f"unix://{daemon.listening.unix_socket}") as c:
        return c.status()


@pytest.mark.parametrize("transport", ["tcp", "unix"])
def test_dqn_clients_never_wait_and_explore_with_the_announced_epsilon(daemon, transport):
    address = (f"tcp://127.0.0.1:{daemon.listening.port}" if transport == "tcp"
               else f"unix://{daemon.listening.unix_socket}")
    before = status(daemon)
    agent = connect(address)
    assert not agent.force_on_policy  # SET_CONFIG: an off-policy default policy
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=0)
    epsilons: list = []
    deadline = time.monotonic() + 60.0
    while len(epsilons) < 1500 or (epsilons[-1] in (None, 1.0) and time.monotonic() < deadline):
        obs2, reward, term, trunc, _ = env.step(agent.act(obs))
        agent.step(reward, obs2, term, trunc)
        obs = env.reset()[0] if term or trunc else obs2
        epsilons.append(agent.policy.epsilon)
    agent.close()
    seen = [e for e in epsilons if e is not None]
    assert seen and seen == sorted(seen, reverse=True) and seen[-1] < 1.0  # announced, falling
    # (the learner's report trails the connector: wait until it counts this client's steps)
    after = wait_for(lambda: (s := status(daemon))["learner"].get("updates", 0)
                     > before["learner"].get("updates", 0)
                     and s["learner"].get("replay_steps", 0) >= 1000 and s, 20,
                     what="DQN updates and the client's steps reported")
    learner = after["learner"]
    assert learner["algorithm"] == "dqn" and learner["replay_steps"] >= 1000
    assert learner["epsilon"] < 1.0 and after["weights_seq_no"] > before["weights_seq_no"]
    assert learner.get("q_mean") is not None and learner.get("policy_loss") is None


@pytest.mark.parametrize("transport", ["tcp", "unix"])
def test_server_side_inference_serves_a_dqn_policy_and_its_steps_fill_the_replay(daemon, transport):
    address = (f"tcp://127.0.0.1:{daemon.listening.port}" if transport == "tcp"
               else f"unix://{daemon.listening.unix_socket}")
    before = status(daemon)["learner"].get("replay_steps", 0)
    agent = connect(address, inference="server")
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=3)
    for _ in range(1200):
        obs2, reward, term, trunc, _ = env.step(agent.act(obs))
        agent.step(reward, obs2, term, trunc)
        obs = env.reset()[0] if term or trunc else obs2
    agent.close()
    wait_for(lambda: status(daemon)["learner"].get("replay_steps", 0) >= min(before + 1000, 100_000),
             20, what="served steps in the replay buffer")


def test_paced_clients_keep_the_learner_within_its_lead(tmp_path):
    """dqn.max_lead_steps = 100: every sample is answered only once the learner is within
    100 env steps of its updates-to-data schedule, so its reported lag stays near that bound
    (without pacing, this in-process learner falls thousands of steps behind)."""
    cfg = load_config(None, [("daemon", "state_dir", str(tmp_path / "state")), ("server", "port", 0),
                             ("learner", "algorithm", "dqn"), ("sampling", "env_steps_per_sample", 100),
                             ("dqn", "learning_starts_steps", 200), ("dqn", "updates_per_step", 1.0),
                             ("dqn", "publish_interval_updates", 10), ("dqn", "max_lead_steps", 100),
                             ("dqn", "hidden_sizes", [32, 32])])
    d = InProcessDaemon(cfg).start()
    try:
        agent = connect(f"tcp://127.0.0.1:{d.listening.port}")
        env = gym.make("CartPole-v1")
        obs, _ = env.reset(seed=0)
        lags = []
        for step in range(2000):
            obs2, reward, term, trunc, _ = env.step(agent.act(obs))
            agent.step(reward, obs2, term, trunc)
            obs = env.reset()[0] if term or trunc else obs2
            if step % 100 == 99:
                with RLlinkClient(f"unix://{d.listening.unix_socket}") as c:
                    lags.append(c.status()["learner"].get("lag_steps") or 0)
        agent.close()
    finally:
        assert d.stop() == {role: 0 for role in ROLES}
    assert max(lags[5:]) <= 100 + 2 * 100, lags  # the lead, a sample, a publication's slack
