"""Tier 1: client-side acting with a recurrent policy in every client_lib client (Agent,
MultiAgentClient, VectorClient) against fake links with a real tiny LSTM/GRU network: the
state is zero when an episode starts (first act, after an episode ends, a new agent), each
step feeds the previous step's state_out, and every fragment sent carries as state_in the
states the actor fed before its steps 0, L, 2L, ... (also fragments continuing an episode)."""
from __future__ import annotations

import base64
import gzip
from dataclasses import replace

import numpy as np
import pytest

from rlinkd.client_lib.agent import Agent
from rlinkd.client_lib.links import LinkConfig, PolicyInfo
from rlinkd.client_lib.multi.client import MultiAgentClient
from rlinkd.client_lib.multi.vector import VectorClient
from rlinkd.client_lib.policy import BoardPolicy, OnnxPolicy
from rlinkd.client_lib.protocol import codec
from rlinkd.client_lib.protocol.netonnx import OnnxWeightWriter
from rlinkd.client_lib.protocol.agents import PolicyMapping
from rlinkd.client_lib.protocol.netnumpy import NumpyNet
from rlinkd.client_lib.protocol.netops import STATE_OUT
from rlinkd.client_lib.protocol.policy_spec import PolicySpec
from rlinkd.client_lib.protocol.spaces import Box, Discrete

OBS, ACT = Box((2,), low=-1000.0, high=1000.0), Discrete(3)
L = 2


def spec_of(cell: str) -> PolicySpec:
    return PolicySpec(OBS, ACT, hidden_sizes=(8,), recurrent=cell, recurrent_size=3, max_seq_len=L)


class Recording(BoardPolicy):
    """A BoardPolicy that logs (obs row 0, state fed) of every forward, per obs value."""

    def __init__(self, spec: PolicySpec, log: list) -> None:
        rng = np.random.default_rng(0)
        super().__init__(spec, spec.init_flat(rng) + rng.normal(0, 0.5, spec.n_params()).astype(np.float32), 1)
        self.log = log

    def forward(self, obs, state):
        for row, s in zip(obs[""], state):
            self.log.append((float(row[0]), s.copy()))
        return super().forward(obs, state)


def config(cell: str, steps: int) -> LinkConfig:
    info = PolicyInfo(OBS, ACT, state=spec_of(cell).state_contract())
    return LinkConfig(steps, True, OBS, ACT, True, {"default": info}, PolicyMapping(()), 8)


class Link:
    """Agent's and the many-agent clients' link verbs; keeps what was sent."""

    def __init__(self, cell: str, steps: int) -> None:
        self.config, self.spec, self.log, self.sent = config(cell, steps), spec_of(cell), [], []

    def open(self):
        return self.config, Recording(self.spec, self.log)

    def open_policies(self):
        return self.config

    def policy(self, name):
        return Recording(self.spec, self.log)

    def use_spaces(self, *spaces):
        pass

    def submit(self, fragments, seq):
        self.sent += fragments

    send_only = submit

    def exchange(self, sends, held, get_state=True):
        """(VectorClient's fragments hold views of its columns: copied, as sending does.)"""
        self.sent += [replace(f, state_in=f.state_in.copy()) for _, f in sends]
        return {}

    def describe(self):
        return "fake"

    def send_message(self, msg):
        pass

    def close(self):
        pass


def obs(v: float) -> np.ndarray:
    return np.array([v, 0.0], np.float32)


def fed(link: Link) -> dict[float, np.ndarray]:
    """The state the actor fed with each (unique) observation value."""
    return {v: s for v, s in link.log}


def check_chain(link: Link, episodes: list[list[float]]) -> None:
    """Each episode's first state is zero and every later one the state_out of the step
    before it (recomputed here with a fresh numpy network)."""
    net, got = NumpyNet(link.spec, Recording(link.spec, []).flat), fed(link)
    for values in episodes:
        state = np.zeros((1, link.spec.state_size), np.float32)
        for v in values:
            np.testing.assert_allclose(got[v], state[0], atol=1e-6, err_msg=f"obs {v}")
            state = net.run({"": obs(v)[None]}, state)[STATE_OUT]


def check_fragments(link: Link) -> None:
    """Every fragment's state_in rows are the states fed with its observations 0, L, ..."""
    got = fed(link)
    assert link.sent
    for frag in link.sent:
        values = frag.obs[""][:frag.num_steps, 0]
        assert frag.state_in.shape == (-(-frag.num_steps // L), link.spec.state_size)
        np.testing.assert_array_equal(frag.state_in, np.stack([got[float(v)] for v in values[::L]]))


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_agent_zeroes_the_state_per_episode_and_sends_the_grid_states(cell):
    link = Link(cell, steps=3)                  # sends cut episodes: fragments continue them
    agent = Agent(link)
    episodes, v = [[], []], 1.0
    for ep, length in enumerate((7, 4)):
        for i in range(length):
            agent.act(obs(v))
            episodes[ep].append(v)
            v += 1.0
            agent.step(1.0, obs(v), i == length - 1, False)
        v += 1.0                                # the reset observation differs
    agent.close()
    check_chain(link, episodes)
    check_fragments(link)
    assert any(f.num_steps > L and not (f.is_terminated or f.is_truncated) for f in link.sent)


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_multi_agent_client_keeps_a_state_per_agent(cell):
    link = Link(cell, steps=5)
    client = MultiAgentClient(link)
    a, b = [10.0 + i for i in range(6)], [50.0 + i for i in range(3)] + [80.0 + i for i in range(3)]
    for i in range(6):
        client.act({"a": obs(a[i]), "b": obs(b[i])})
        client.step({"a": 0.0, "b": 0.0}, {"a": obs(a[i] + 1), "b": obs(b[i] + 1)},
                    terminated={"b": i == 2})   # b's episode ends: its next act starts anew
    client.close()
    check_chain(link, [a, b[:3], b[3:]])
    check_fragments(link)


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_vector_client_zeroes_the_copies_that_reset(cell):
    link = Link(cell, steps=6)                  # horizon 3 per copy: episodes cut across sends
    client = VectorClient(link, num_envs=2)
    c0, c1 = [1.0 + i for i in range(7)], [100.0 + i for i in range(4)] + [200.0 + i for i in range(3)]
    for t in range(7):
        client.act(np.stack([obs(c0[t]), obs(c1[t])]))
        client.step(np.zeros(2), np.stack([obs(c0[t] + 1), obs(c1[t] + 1)]),
                    terminated=np.array([False, t == 3]))
    client.close()
    check_chain(link, [c0, c1[:4], c1[4:]])
    check_fragments(link)


def test_a_feed_forward_policy_sends_no_state():
    link = Link("gru", steps=3)
    link.config = LinkConfig(3, True, OBS, ACT, True, {"default": PolicyInfo(OBS, ACT)},
                             PolicyMapping(()), 8)
    link.spec = PolicySpec(OBS, ACT, hidden_sizes=(8,))
    agent = Agent(link)
    for i in range(4):
        agent.act(obs(float(i)))
        agent.step(0.0, obs(i + 1.0), False, False)
    agent.close()
    assert link.sent and all(f.state_in is None for f in link.sent)


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_the_onnx_policy_feeds_and_returns_the_state_as_the_board_policy(cell):
    spec = spec_of(cell)
    board = Recording(spec, [])
    model = OnnxWeightWriter(spec).encode(board.flat)
    onnx = OnnxPolicy(codec.SetState(weights_seq_no=1, onnx_file=base64.b64encode(
        gzip.compress(model)).decode()))
    assert onnx.state_size == board.state_size == spec.state_size
    x = {"": np.array([[1.0, -2.0], [3.0, 0.5]], np.float32)}
    state = np.random.default_rng(1).normal(size=(2, spec.state_size)).astype(np.float32)
    for got, want in zip(onnx.forward(x, state), BoardPolicy.forward(board, x, state)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


class CountingEnv:
    """Observations [v, 0] with v unique: episode e's reset is 100 * e, each step adds 1;
    episodes last 100 steps (never ended by the runs here)."""

    observation_space, action_space = None, None

    def __init__(self) -> None:
        self.episode, self.v = 0, 0.0

    def reset(self, seed=None, options=None):
        self.episode += 1
        self.v = 100.0 * self.episode
        return obs(self.v), {}

    def step(self, action):
        self.v += 1.0
        return obs(self.v), 1.0, False, False, {}


SHIFT = np.array([50.0, 0.0], np.float32)


class CountingVectorEnv(CountingEnv):
    """Two copies: copy 1's observations are copy 0's + 50."""

    num_envs, metadata, single_observation_space = 2, {"autoreset_mode": "SameStep"}, None

    def reset(self, seed=None, options=None):
        first, info = super().reset(seed)
        return np.stack([first, first + SHIFT]), info

    def step(self, actions):
        nxt, r, _, _, info = super().step(actions)
        return np.stack([nxt, nxt + SHIFT]), np.full(2, r), np.zeros(2, bool), np.zeros(2, bool), info


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_run_env_again_with_the_same_agent_truncates_the_open_episode(cell):
    """A run stopped mid-episode, then another on the reset env: the first episode ends
    truncated, the second starts with the reset observation and a zero state."""
    from rlinkd.client_lib.runner import run_env
    link, env = Link(cell, steps=1000), CountingEnv()
    agent = Agent(link)
    run_env(env, agent, steps=5)
    run_env(env, agent, steps=3)
    agent.close()
    first, second = link.sent
    assert first.is_truncated and first.obs[""][:, 0].tolist() == [100.0 + i for i in range(6)]
    assert not second.is_truncated and second.obs[""][:, 0].tolist() == [200.0 + i for i in range(4)]
    check_chain(link, [[100.0 + i for i in range(5)], [200.0 + i for i in range(3)]])
    check_fragments(link)


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_run_env_again_with_the_same_vector_client_truncates_every_open_episode(cell):
    from rlinkd.client_lib.runner import run_env
    link, env = Link(cell, steps=1000), CountingVectorEnv()
    client = VectorClient(link, num_envs=2)
    run_env(env, client, steps=8)   # 4 steps per copy
    run_env(env, client, steps=4)   # 2 more, after the reset
    client.close()
    pieces = {(f.agent_id, f.obs[""][0, 0]): f for f in link.sent}
    assert len(pieces) == 4 and len({(f.agent_id, f.episode_id) for f in link.sent}) == 4
    for copy, offset in (("env_0", 0.0), ("env_1", 50.0)):
        old, new = pieces[(copy, 100.0 + offset)], pieces[(copy, 200.0 + offset)]
        assert old.is_truncated and old.obs[""][:, 0].tolist() == [100.0 + offset + i for i in range(5)]
        assert not old.is_terminated and not new.is_truncated and new.num_steps == 2
    check_chain(link, [[base + i for i in range(n)] for base, n in
                       ((100.0, 4), (150.0, 4), (200.0, 2), (250.0, 2))])
    check_fragments(link)


def test_truncate_refuses_a_pending_action():
    agent, client = Agent(Link("gru", 10)), VectorClient(Link("gru", 10), num_envs=2)
    agent.act(obs(1.0))
    client.act(np.stack([obs(1.0), obs(2.0)]))
    for c in (agent, client):
        with pytest.raises(ValueError, match="pending"):
            c.truncate()


def test_a_vector_copy_whose_piece_was_sent_starts_its_next_episode_under_a_new_id():
    """Truncated right after a send (no steps in the columns): the open pieces went out as
    cut, so the next episodes must not continue their ids."""
    from rlinkd.client_lib.runner import run_env
    link, env = Link("gru", steps=8), CountingVectorEnv()   # horizon 4: the run ends with a send
    client = VectorClient(link, num_envs=2)
    run_env(env, client, steps=8)
    run_env(env, client, steps=4)
    client.close()
    ids = {(f.agent_id, float(f.obs[""][0, 0])): f.episode_id for f in link.sent}
    assert ids[("env_0", 100.0)] != ids[("env_0", 200.0)] and ids[("env_1", 150.0)] != ids[("env_1", 250.0)]
    check_chain(link, [[base + i for i in range(n)] for base, n in
                       ((100.0, 4), (150.0, 4), (200.0, 2), (250.0, 2))])


def test_an_evaluation_episode_cut_short_by_truncate_is_not_reported():
    link = Link("gru", steps=10)
    sent: list = []
    link.send_message, link.refresh = sent.append, lambda seq: None  # type: ignore[method-assign]
    agent = Agent(link, mode="evaluate")
    for i in range(5):
        agent.act(obs(float(i)))
        agent.step(1.0, obs(i + 1.0), False, False)
    agent.truncate()
    agent.act(obs(9.0))
    agent.step(2.0, obs(10.0), True, False)
    agent.close()
    episodes = [e for msg in sent for e in msg.episodes]
    assert [(e.episode_return, e.episode_length) for e in episodes] == [(2.0, 1)]
