"""SAC through the whole daemon in one process: SET_CONFIG announces the squashed Gaussian,
clients (client- and server-side inference, both transports) draw actions inside the bounds
and never wait, the replay buffer fills, the learner trains while they sample, tunes its
entropy coefficient and reports as a SAC learner."""
from __future__ import annotations

import time

import gymnasium as gym
import numpy as np
import pytest

from rlinkd.client_lib import connect
from rlinkd.client_lib.transport import RLlinkClient
from rlinkd.daemon.config import load_config
from rlinkd.daemon.inprocess import InProcessDaemon
from rlinkd.daemon.roster import ROLES
from tests.helpers import wait_for


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sac")
    cfg = load_config(None, [("daemon", "state_dir", str(tmp / "state")), ("server", "port", 0),
                             ("env", "id", "Pendulum-v1"), ("learner", "algorithm", "sac"),
                             ("sampling", "env_steps_per_sample", 100),
                             ("sac", "learning_starts_steps", 200), ("sac", "updates_per_step", 0.25),
                             ("sac", "publish_interval_updates", 10), ("sac", "batch_size", 64),
                             ("sac", "hidden_sizes", [32, 32])])
    d = InProcessDaemon(cfg).start()
    yield d
    assert d.stop() == {role: 0 for role in ROLES}


def status(daemon) -> dict:
    with RLlinkClient(f"unix://{daemon.listening.unix_socket}") as c:
        return c.status()


def address(daemon, transport: str) -> str:
    return (f"tcp://127.0.0.1:{daemon.listening.port}" if transport == "tcp"
            else f"unix://{daemon.listening.unix_socket}")


def play(agent, steps: int, seed: int) -> np.ndarray:
    """Pendulum steps; every action taken, [steps, 1]; no single step may wait long."""
    env = gym.make("Pendulum-v1")
    obs, _ = env.reset(seed=seed)
    actions, slowest = [], 0.0
    for _ in range(steps):
        started = time.monotonic()
        action = agent.act(obs)
        obs2, reward, term, trunc, _ = env.step(action)
        agent.step(reward, obs2, term, trunc)
        slowest = max(slowest, time.monotonic() - started)
        actions.append(np.asarray(action, np.float32).reshape(1))
        obs = env.reset()[0] if term or trunc else obs2
    assert slowest < 5.0, f"a step waited {slowest:.1f} s"
    return np.asarray(actions)


@pytest.mark.parametrize("transport", ["tcp", "unix"])
def test_sac_clients_sample_squashed_actions_and_never_wait(daemon, transport):
    before = status(daemon)
    with RLlinkClient(address(daemon, transport)) as raw:
        config = raw.get_config()
    assert config.box_dist == "squashed_gaussian" and config.force_on_policy is False
    agent = connect(address(daemon, transport))
    assert not agent.force_on_policy and agent.chooser.dist.comps[0].kind == "squashed_gaussian"
    actions = play(agent, 1500, seed=0)
    agent.close()
    assert np.all(np.abs(actions) <= 2.0) and actions.std() > 0.3  # inside the bounds, exploring
    after = wait_for(lambda: (s := status(daemon))["learner"].get("updates", 0)
                     > before["learner"].get("updates", 0) + 20 and s, 30, what="SAC updates reported")
    learner = after["learner"]
    assert learner["algorithm"] == "sac" and learner["replay_steps"] >= 1000
    assert learner["epsilon"] is None and 0.0 < learner["ent_coef"] < 1.0  # alpha tuned down
    assert learner["policy_loss"] is not None and learner["q_mean"] is not None
    assert after["weights_seq_no"] > before["weights_seq_no"]


@pytest.mark.parametrize("transport", ["tcp", "unix"])
def test_server_side_inference_serves_a_sac_policy_and_its_steps_fill_the_replay(daemon, transport):
    before = status(daemon)["learner"].get("replay_steps", 0)
    agent = connect(address(daemon, transport), inference="server")
    actions = play(agent, 1200, seed=3)
    agent.close()
    assert np.all(np.abs(actions) <= 2.0) and actions.std() > 0.1
    assert np.mean(np.abs(actions) == 2.0) < 0.5  # squashed by the inference role, not clipped
    wait_for(lambda: status(daemon)["learner"].get("replay_steps", 0) >= min(before + 1000, 100_000),
             20, what="served steps in the replay buffer")
