"""Agent modes against a fake link: evaluation sends no training data (only EVAL_RESULTS)
and refreshes weights; a greedy act on a training agent cuts its fragment; the keyword
rules of connect()."""
from __future__ import annotations

import numpy as np
import pytest

from rlinkd.client_lib.agent import Agent, connect
from rlinkd.client_lib.links import LinkConfig, PolicyInfo
from rlinkd.client_lib.protocol.agents import PolicyMapping
from rlinkd.client_lib.protocol.serving import EvalResults, Metrics
from rlinkd.client_lib.protocol.spaces import Box, Discrete

OBS, ACT = Box((2,), low=-10.0, high=10.0), Discrete(2)


class Net:
    def __init__(self, seq: int) -> None:
        self.weights_seq_no = seq

    def dist_inputs(self, x):
        return np.array([[0.0, 1.0]], np.float32)


class Link:
    def __init__(self, steps: int = 100) -> None:
        self.config = LinkConfig(steps, True, OBS, ACT, True, {"default": PolicyInfo(OBS, ACT)},
                                 PolicyMapping(()), None)
        self.submitted, self.messages, self.refreshes = [], [], 0

    def open(self):
        return self.config, Net(1)

    def use_spaces(self, *spaces):
        pass

    def submit(self, fragments, seq):
        self.submitted += fragments
        return None

    def send_only(self, fragments, seq):
        self.submitted += fragments

    def send_message(self, msg):
        self.messages.append(msg)

    def refresh(self, seq):
        self.refreshes += 1
        return Net(seq + 1)

    def close(self):
        pass


def play(agent, episodes: int, length: int = 3) -> None:
    o = np.zeros(2, np.float32)
    for _ in range(episodes):
        for t in range(length):
            agent.act(o)
            agent.step(1.0, o, t == length - 1, False)


def test_evaluation_sends_no_training_data_and_reports_returns():
    link = Link(steps=2)
    agent = Agent(link, mode="evaluate")
    play(agent, 2)
    agent.log_metric("fps", 30.0)
    agent.close()
    assert link.submitted == []  # nothing that trains, not even at close
    results = [m for m in link.messages if isinstance(m, EvalResults)]
    episodes = [e for m in results for e in m.episodes]
    assert [(e.episode_return, e.episode_length) for e in episodes] == [(3.0, 3), (3.0, 3)]
    assert link.refreshes == 2 and agent.weights_seq_no == 3  # newer weights after each episode
    assert Metrics({"fps": 30.0}) in link.messages


def test_a_greedy_act_on_a_training_agent_cuts_its_fragment():
    link = Link()
    agent = Agent(link)
    o = np.zeros(2, np.float32)
    agent.act(o)
    agent.step(1.0, o, False, False)
    agent.act(o, explore=False)      # greedy: not trained on
    agent.step(5.0, o + 1, False, False)
    agent.act(o + 1)
    agent.step(1.0, o, True, False)
    agent.sync()
    frags = link.submitted
    assert [f.num_steps for f in frags] == [1, 1]
    assert not frags[0].is_terminated and not frags[0].is_truncated and frags[1].is_terminated
    assert 5.0 not in np.concatenate([f.rewards for f in frags])


def test_mode_rules():
    with pytest.raises(ValueError, match="evaluate"):
        Agent(Link(), explore=False)
    with pytest.raises(ValueError, match="mode must be"):
        connect("tcp://127.0.0.1:1", mode="play")
    with pytest.raises(ValueError, match="inference must be"):
        connect("tcp://127.0.0.1:1", inference="gpu")
