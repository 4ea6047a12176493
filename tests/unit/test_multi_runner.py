"""run_env's VectorEnv and ParallelEnv drivers against a fake link (what reaches the wire),
the Rendezvous task's API and baselines, and client_lib's import direction."""
from __future__ import annotations

import itertools
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest

from rlinkd.client_lib import run_env
from rlinkd.client_lib.links import LinkConfig, PolicyInfo
from rlinkd.client_lib.multi.client import MultiAgentClient
from rlinkd.client_lib.multi.vector import VectorClient
from rlinkd.client_lib.protocol.agents import PolicyMapping
from rlinkd.client_lib.protocol.spaces import space_from_gym
from tests.tasks.rendezvous import CELLS, Rendezvous, oracle, returns


class UniformNet:
    def __init__(self, size: int) -> None:
        self.size, self.weights_seq_no = size, 0

    def dist_inputs(self, x):
        return np.zeros((len(next(iter(x.values()))), self.size), np.float32)


class RecordingLink:
    def __init__(self, obs_space, act_space, steps: int) -> None:
        obs, act = space_from_gym(obs_space), space_from_gym(act_space)
        self.config = LinkConfig(steps, True, obs, act, True, {"default": PolicyInfo(obs, act)},
                                 PolicyMapping(), 64)
        self.size = int(act_space.n)
        self.fragments: list = []

    def open_policies(self):
        return self.config

    def describe(self):
        return "recording"

    def policy(self, name):
        return UniformNet(self.size)

    def exchange(self, sends, held, get_state=True):
        self.fragments += [f for _, f in sends]
        return {}

    def close(self):
        pass


def by_agent(fragments):
    out: dict = {}
    for f in fragments:
        out.setdefault(f.agent_id, []).append(f)
    return out


@pytest.mark.parametrize("mode", ["NextStep", "SameStep"])
def test_vector_driver_records_true_final_obs_and_reset_obs(mode):
    env = gym.make_vec("CartPole-v1", num_envs=3, vectorization_mode="sync",
                       vector_kwargs={"autoreset_mode": mode})
    link = RecordingLink(env.single_observation_space, env.single_action_space, steps=90)
    client = VectorClient(link, 3, seed=0)
    stats = run_env(env, client, steps=300, seed=0)
    client.close()
    assert stats.steps == 300 and stats.episodes > 0
    pieces = by_agent(link.fragments)
    assert set(pieces) == {"env_0", "env_1", "env_2"}
    assert sum(f.num_steps for f in link.fragments) == 300
    for frags in pieces.values():
        for prev, nxt in itertools.pairwise(frags):
            ended = prev.is_terminated or prev.is_truncated
            if prev.is_terminated:  # CartPole fails outside +-12 degrees or +-2.4
                final = prev.obs[""][-1]
                assert abs(final[2]) > 0.2094 or abs(final[0]) > 2.4
            first = nxt.obs[""][0]
            if ended:  # a reset obs: all components within +-0.05
                assert np.abs(first).max() <= 0.05 and nxt.episode_id != prev.episode_id
            else:
                np.testing.assert_array_equal(first, prev.obs[""][-1])
                assert nxt.episode_id == prev.episode_id
    assert stats.episodes == sum(f.is_terminated or f.is_truncated for f in link.fragments)


def test_parallel_driver_agents_join_and_leave():
    env = Rendezvous()
    link = RecordingLink(env.observation_space("a0"), env.action_space("a0"), steps=10_000)
    client = MultiAgentClient(link, seed=0)
    stats = run_env(env, client, seed=3, episodes=9)  # 3 env episodes: 3 agent episodes each
    client.close()
    pieces = by_agent(link.fragments)
    assert [f.is_terminated for f in pieces["a0"]] == [True] * 3      # a0 leaves each time
    assert all(f.is_truncated for f in pieces["a1"] + pieces["a2"])  # the rest hit the limit
    assert all(f.num_steps == 24 for f in pieces["a1"])
    assert all(12 <= f.num_steps < 18 for f in pieces["a0"])
    assert all(24 - 10 < f.num_steps <= 24 - 4 for f in pieces["a2"])  # joined in [4, 10)
    assert len({f.episode_id for f in pieces["a2"]}) == 3
    assert stats.steps == sum(f.num_steps for f in link.fragments) and stats.episodes == 9


def test_rendezvous_follows_the_parallel_api_and_separates_baselines():
    pettingzoo_test = pytest.importorskip("pettingzoo.test")
    pettingzoo_test.parallel_api_test(Rendezvous(), num_cycles=100)
    rng = np.random.default_rng(0)
    assert returns(oracle, 100) > 15
    assert returns(lambda o: {a: int(rng.integers(3)) for a in o}, 100) < 1.5
    assert all(returns(lambda o, k=k: dict.fromkeys(o, k), 100) < 6 for k in range(3))
    obs, _ = Rendezvous().reset(seed=0)
    assert obs["a0"].shape == (2 * CELLS + 1,)


def test_client_lib_imports_without_torch_pettingzoo_or_the_daemon():
    code = ("import sys; import rlinkd.client_lib.multi, rlinkd.client_lib.runner,"
            " rlinkd.client_lib.agent;"
            "bad = [m for m in ('torch', 'pettingzoo', 'rlinkd.daemon') if m in sys.modules];"
            "assert not bad, bad")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
