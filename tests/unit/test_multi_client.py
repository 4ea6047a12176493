"""MultiAgentClient and VectorClient against a fake link: per-agent fragments, episode ids,
cut/continue, agents joining and leaving, every ValueError, vector autoreset splitting,
policy grouping."""
from __future__ import annotations

import numpy as np
import pytest

from rlinkd.client_lib.links import LinkConfig, PolicyInfo
from rlinkd.client_lib.multi import MultiAgentUnsupported
from rlinkd.client_lib.multi.client import MultiAgentClient
from rlinkd.client_lib.multi.vector import VectorClient
from rlinkd.client_lib.protocol.agents import PolicyMapping
from rlinkd.client_lib.protocol.distributions import ActionDist, components
from rlinkd.client_lib.protocol.spaces import Box, Dict, Discrete, InvalidValue

OBS = Box((2,), low=-100.0, high=100.0)
ACT = Discrete(3)


class FakeNet:
    """dist_inputs: logits favouring action (row's obs[0] mod 3); counts calls and rows."""

    def __init__(self, seq: int, calls: list) -> None:
        self.weights_seq_no, self.calls = seq, calls

    def dist_inputs(self, x):
        col = x[""] if "" in x else x["a"]
        self.calls.append(len(col))
        logits = np.full((len(col), 3), -20.0, np.float32)
        logits[np.arange(len(col)), np.abs(col[:, 0]).astype(int) % 3] = 20.0
        return logits


class FakeLink:
    def __init__(self, steps=6, max_agents=8, mapping=(), policies=None, multi=True) -> None:
        self.policies = policies or {"default": PolicyInfo(OBS, ACT)}
        self.config = LinkConfig(steps, True, OBS, ACT, True, self.policies,
                                 PolicyMapping(tuple(mapping)), max_agents if multi else None)
        self.sent: list = []       # (sends, held, get_state) per exchange
        self.calls: dict[str, list] = {}
        self.seq = 0
        self.closed = False

    def open_policies(self):
        return self.config

    def describe(self):
        return "fake"

    def policy(self, name):
        return FakeNet(self.seq, self.calls.setdefault(name, []))

    def exchange(self, sends, held, get_state=True):
        self.sent.append((list(sends), dict(held), get_state))
        if not get_state:
            return {}
        self.seq += 1
        return {name: FakeNet(self.seq, self.calls[name]) for name in held}

    def close(self):
        self.closed = True


def obs(v):
    return np.array([v, 0.0], np.float32)


def frags(link, i=-1):
    return [f for _, f in link.sent[i][0]]


# ---------------------------------------------------------------- MultiAgentClient
def test_agents_get_their_own_fragments_episodes_and_policy_ids():
    link = FakeLink(steps=6)
    c = MultiAgentClient(link, explore=False, seed=0)
    assert c.act({"a": obs(1), "b": obs(2)}) == {"a": 1, "b": 2}
    c.step({"a": 1.0, "b": 2.0}, {"a": obs(3), "b": obs(4)}, terminated={"a": True})
    assert c.agents == ["b"]                          # a left
    c.act({"a": obs(5), "b": obs(4)})                 # a again: a new episode
    c.step({"a": 0.5, "b": 0.25}, {"a": obs(6), "b": obs(7)})
    assert not link.sent
    c.act({"a": obs(6), "b": obs(7)})
    c.step({"a": 0.0, "b": 0.0}, {"a": obs(8), "b": obs(9)}, truncated={"b": True})
    sent = frags(link)
    assert [(f.agent_id, f.num_steps, f.is_terminated, f.is_truncated) for f in sent] == [
        ("a", 1, True, False), ("b", 3, False, True), ("a", 2, False, False)]
    a1, b, a2 = sent
    assert a1.episode_id != a2.episode_id and len({a1.episode_id, b.episode_id, a2.episode_id}) == 3
    assert all(f.policy_id == "default" for f in sent)
    np.testing.assert_array_equal(a1.obs[""][:, 0], [1, 3])
    np.testing.assert_array_equal(b.obs[""][:, 0], [2, 4, 7, 9])
    np.testing.assert_array_equal(a2.obs[""][:, 0], [5, 6, 8])
    np.testing.assert_array_equal(b.rewards, [2.0, 0.25, 0.0])
    np.testing.assert_array_equal(b.actions[:, 0], [2, 1, 1])  # greedy: obs[0] mod 3
    assert b.action_logp.shape == (3,) and b.action_dist_inputs.shape == (3, 3)
    assert link.sent[-1][1] == {"default": 0} and c.weights_seq_nos() == {"default": 1}


def test_cut_episode_continues_with_same_id_and_repeated_obs():
    link = FakeLink(steps=2)
    c = MultiAgentClient(link, explore=False)
    for k in range(3):
        c.act({"a": obs(k)})
        c.step({"a": 1.0}, {"a": obs(k + 1)})
    c.close()
    first, second = frags(link, 0)[0], frags(link, 1)[0]
    assert first.episode_id == second.episode_id and not first.is_terminated
    np.testing.assert_array_equal(first.obs[""][:, 0], [0, 1, 2])
    np.testing.assert_array_equal(second.obs[""][:, 0], [2, 3])  # first repeats the last
    assert link.sent[1][2] is False and link.closed


def test_slots_are_reused_after_an_episode_ends_in_order():
    link = FakeLink(steps=100)
    c = MultiAgentClient(link)
    c.act({"a": obs(0), "b": obs(0)})
    c.step({"a": 0, "b": 0}, {"a": obs(0), "b": obs(0)}, terminated={"a": True})
    c.act({"c": obs(0), "b": obs(0)})                # c takes a's slot 0
    c.step({"c": 0, "b": 0}, {"c": obs(0), "b": obs(0)})
    c.sync()
    slots = [(slot, f.agent_id) for slot, f in link.sent[0][0]]
    assert slots == [(0, "a"), (1, "b"), (0, "c")]   # a's end precedes c on slot 0


@pytest.mark.parametrize("call, message", [
    (lambda c: c.step({"x": 1.0}, {"x": obs(0)}), "agent 'x' has no pending action"),
    (lambda c: c.step({"a": 1.0}, {"a": obs(0)}), "agent 'b' has a pending action but no reward"),
    (lambda c: c.act({"a": obs(0)}), "agent 'a' already has a pending action"),
    (lambda c: c.act({"": obs(0)}), "1..64 characters"),
    (lambda c: c.act({"é": obs(0)}), "printable ASCII"),
    (lambda c: c.act({7: obs(0)}), "must be a string"),
    (lambda c: c.act({"c": obs(0), "d": obs(0)}), "agent 'd' would exceed the server's "
                                                   r"max_agents_per_connection \(3\)"),
    (lambda c: c.step({"a": 1.0, "b": 1.0}, {"a": obs(0)}), "no next_obs for agent 'b'"),
    (lambda c: c.step({"a": 1.0, "b": 1.0}, {"a": obs(0), "b": obs(0)}, terminated={"z": True}),
     "terminated names agent 'z'"),
])
def test_value_errors_name_the_agent_and_record_nothing(call, message):
    link = FakeLink(steps=100, max_agents=3)
    c = MultiAgentClient(link)
    c.act({"a": obs(0), "b": obs(0)})
    with pytest.raises(ValueError, match=message):
        call(c)
    c.step({"a": 1.0, "b": 1.0}, {"a": obs(1), "b": obs(1)})  # state unchanged: still valid
    assert [len(e.buffer.rewards) for e in c.episodes.values()] == [1, 1]


def test_bad_observation_names_the_agent():
    c = MultiAgentClient(FakeLink())
    with pytest.raises(InvalidValue, match=r"obs\['b'\]"):
        c.act({"a": obs(0), "b": np.array([999.0, 0.0], np.float32)})
    assert c.agents == []


def test_an_observation_of_another_shape_points_at_the_daemons_observation_space():
    """A PettingZoo env (18 numbers per agent) against a daemon started for 2: the error says
    where the daemon's space is set, for one agent and for a vector of envs."""
    c = MultiAgentClient(FakeLink())
    with pytest.raises(InvalidValue, match=r"obs\['a'\]: shape \[18\], space wants \[2\]; .*\[env\] observation_space"):
        c.act({"a": np.zeros(18, np.float32)})
    v = VectorClient(FakeLink(max_agents=4), num_envs=2)
    with pytest.raises(InvalidValue, match=r"\[env\] observation_space"):
        v.act(np.zeros((2, 18), np.float32))
    with pytest.raises(InvalidValue) as out_of_bounds:                  # not a shape: no hint
        c.act({"a": np.array([999.0, 0.0], np.float32)})
    assert "[env]" not in str(out_of_bounds.value)


def test_server_without_agent_limit_is_refused_clearly():
    link = FakeLink(multi=False)
    with pytest.raises(MultiAgentUnsupported, match="max_agents_per_connection"):
        MultiAgentClient(link)
    assert link.closed


def test_one_forward_per_policy_and_policy_ids_from_the_mapping():
    wide = Dict((("a", Box((2,), low=-10.0, high=10.0)),))
    policies = {"default": PolicyInfo(OBS, ACT), "red": PolicyInfo(wide, ACT)}
    link = FakeLink(steps=5, mapping=[("red_*", "red")], policies=policies)
    c = MultiAgentClient(link, seed=1)
    assert c.policy_for("red_1") == "red" and c.policy_for("blue") == "default"
    actions = c.act({"red_0": {"a": obs(1)}, "blue": obs(2), "red_1": {"a": obs(0)}})
    assert set(actions) == {"red_0", "blue", "red_1"}
    assert link.calls == {"red": [2], "default": [1]}   # one forward per policy, all rows
    c.step({"red_0": 1, "blue": 1, "red_1": 1},
           {"red_0": {"a": obs(1)}, "blue": obs(2), "red_1": {"a": obs(0)}})
    c.sync()
    by_agent = {f.agent_id: f.policy_id for f in frags(link)}
    assert by_agent == {"red_0": "red", "blue": "default", "red_1": "red"}
    assert link.sent[0][1] == {"red": 0, "default": 0}


def test_batched_chooser_matches_distribution():
    link = FakeLink(steps=10_000, max_agents=400)
    c = MultiAgentClient(link, seed=3)
    ids = [f"x{i}" for i in range(300)]
    out = c.act({a: obs(i % 3) for i, a in enumerate(ids)})
    assert all(out[a] == i % 3 for i, a in enumerate(ids))  # near-deterministic logits
    ep = c.episodes["x1"]
    dist = ActionDist(components(ACT))
    assert ep.pending[1] == pytest.approx(
        float(dist.log_prob(ep.pending[2][None], ep.pending[0][None])[0]), abs=1e-5)


# ---------------------------------------------------------------- VectorClient
def test_vector_autoreset_splits_per_copy_fragments():
    link = FakeLink(steps=8, max_agents=4)
    v = VectorClient(link, 2, explore=False)
    assert v.horizon == 4
    o = np.array([[1, 0], [2, 0]], np.float32)
    script = [  # (next obs batch, terminated, act obs after it)
        ([[3, 0], [4, 0]], [False, True], [[3, 0], [10, 0]]),   # copy 1 ends: reset obs 10
        ([[5, 0], [11, 0]], [False, False], [[5, 0], [11, 0]]),
        ([[6, 0], [12, 0]], [True, False], [[20, 0], [12, 0]]),  # copy 0 ends
        ([[21, 0], [13, 0]], [False, False], None),
    ]
    for next_obs, term, after in script:
        acts = v.act(o)
        assert acts.shape == (2,) and acts.dtype == np.int64
        v.step(np.ones(2), np.array(next_obs, np.float32), np.array(term), np.zeros(2, bool))
        o = None if after is None else np.array(after, np.float32)
    sent = frags(link)
    got = [(s, f.agent_id, f.obs[""][:, 0].tolist(), f.is_terminated) for s, f in link.sent[0][0]]
    assert got == [(0, "env_0", [1, 3, 5, 6], True), (0, "env_0", [20, 21], False),
                   (1, "env_1", [2, 4], True), (1, "env_1", [10, 11, 12, 13], False)]
    assert sent[0].episode_id != sent[1].episode_id and sent[2].episode_id != sent[3].episode_id
    assert all(f.policy_id == "default" for f in sent)
    np.testing.assert_array_equal(sent[2].actions[:, 0], [2])     # greedy: obs[0] mod 3
    # continuation: the next send starts from the cut pieces' last obs, same episode ids
    v.act(np.array([[21, 0], [13, 0]], np.float32))
    v.step(np.zeros(2), np.array([[22, 0], [14, 0]], np.float32), None, np.array([False, True]))
    v.close()
    later = frags(link)
    assert [f.obs[""][:, 0].tolist() for f in later] == [[21, 22], [13, 14]]
    assert [f.episode_id for f in later] == [sent[1].episode_id, sent[3].episode_id]
    assert later[1].is_truncated and link.sent[-1][2] is False


def test_vector_episode_ids_advance_after_a_done_at_the_last_row():
    link = FakeLink(steps=2, max_agents=2)
    v = VectorClient(link, 2)
    v.act(np.zeros((2, 2), np.float32))
    v.step(np.zeros(2), np.zeros((2, 2), np.float32), np.array([True, False]))  # send
    v.act(np.ones((2, 2), np.float32))
    v.step(np.zeros(2), np.ones((2, 2), np.float32), np.array([True, True]))
    first, second = frags(link, 0), frags(link, 1)
    assert first[0].episode_id != second[0].episode_id                 # env_0: new episode
    assert first[1].episode_id == second[1].episode_id                 # env_1: continued
    np.testing.assert_array_equal(second[0].obs[""][:, 0], [1, 1])     # reset obs recorded


def test_vector_errors():
    with pytest.raises(ValueError, match="exceeds the server's max_agents_per_connection"):
        VectorClient(FakeLink(max_agents=3), 4)
    with pytest.raises(MultiAgentUnsupported):
        VectorClient(FakeLink(multi=False), 2)
    v = VectorClient(FakeLink(), 2)
    with pytest.raises(ValueError, match="without act"):
        v.step(np.zeros(2), np.zeros((2, 2)))
    v.act(np.zeros((2, 2), np.float32))
    with pytest.raises(ValueError, match="act\\(\\) again"):
        v.act(np.zeros((2, 2), np.float32))
    with pytest.raises(ValueError, match="rewards must have shape"):
        v.step(np.zeros(3), np.zeros((2, 2)))
    with pytest.raises(InvalidValue):
        v.step(np.zeros(2), np.zeros((3, 2)))
    v.step(np.zeros(2), np.zeros((2, 2)))


def test_vector_groups_copies_by_policy():
    policies = {"default": PolicyInfo(OBS, ACT), "odd": PolicyInfo(OBS, ACT)}
    link = FakeLink(steps=4, mapping=[("env_[13]", "odd")], policies=policies)
    v = VectorClient(link, 4)
    v.act(np.zeros((4, 2), np.float32))
    assert link.calls == {"default": [2], "odd": [2]}
    v.step(np.zeros(4), np.zeros((4, 2), np.float32))
    assert [f.policy_id for f in frags(link)] == ["default", "odd", "default", "odd"]
    with pytest.raises(ValueError, match="different spaces"):
        VectorClient(FakeLink(mapping=[("env_1", "odd")], policies={
            "default": PolicyInfo(OBS, ACT), "odd": PolicyInfo(OBS, Discrete(2))}), 2)


def test_truncate_ends_open_episodes_at_their_last_step():
    link = FakeLink(steps=100)
    c = MultiAgentClient(link)
    c.act({"a": obs(1), "b": obs(2)})
    c.step({"a": 1.0, "b": 1.0}, {"a": obs(3), "b": obs(4)})
    c.act({"c": obs(0)})
    with pytest.raises(ValueError, match="agent 'c' has a pending action"):
        c.truncate()
    c.step({"c": 0.0}, {"c": obs(1)})
    c.act({"d": obs(0)})
    c.episodes["d"].pending = None                   # d: an episode without steps
    c.truncate()
    assert c.agents == [] and c.slots.acquire() == 0
    c.sync()
    assert [(f.agent_id, f.is_truncated, f.obs[""][-1, 0]) for f in frags(link)] == [
        ("a", True, 3), ("b", True, 4), ("c", True, 1)]
