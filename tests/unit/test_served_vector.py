"""ServedVectorClient over a scripted TCP server: the STEP_BATCH entries it sends (STARTs,
STEPs with the rewards since each copy's last action, ENDs carried into the next act),
recovery from a lost episode, and its argument rules."""
from __future__ import annotations

import numpy as np
import pytest

from rlinkd.client_lib.multi import connect_vector
from rlinkd.client_lib.protocol import codec, serving
from rlinkd.client_lib.protocol.spaces import Box, Discrete, InvalidValue
from rlinkd.client_lib.served import ServedTcpLink
from rlinkd.client_lib.served_vector import ServedVectorClient
from rlinkd.client_lib.transport import Address, ServerError

CONFIG = codec.SetConfig(env_steps_per_sample=100, force_on_policy=True,
                         observation_space=Box((2,), low=-10.0, high=10.0).to_json(),
                         action_space=Discrete(3).to_json())


class ScriptedServer:
    """Answers each STEP_BATCH with action i % 3 for entry i (None for ends), or raises the
    queued ERROR once."""

    def __init__(self) -> None:
        self.batches: list[tuple[serving.BatchEntry, ...]] = []
        self.fail_next: ServerError | None = None
        self.reply: serving.Actions | None = None

    def send(self, msg) -> None:
        assert isinstance(msg, serving.StepBatch)
        self.batches.append(msg.steps)
        self.reply = serving.Actions([None if e.ends else i % 3 for i, e in enumerate(msg.steps)],
                                     [-1 if e.ends else 7 for e in msg.steps])

    def recv(self):
        if self.fail_next is not None:
            exc, self.fail_next = self.fail_next, None
            raise exc
        return self.reply

    def close(self) -> None:
        pass


class ScriptedLink(ServedTcpLink):
    def __init__(self, server: ScriptedServer) -> None:
        super().__init__(Address("tcp", "127.0.0.1", 1), None, reconnect_timeout_s=1.0)
        self.server, self.connects = server, 0

    def _connect(self) -> None:
        self.connects += 1
        self.config, self.client = CONFIG, self.server  # type: ignore[assignment]
        self.hot = self.client


def client_and_server(n: int = 3) -> tuple[ServedVectorClient, ScriptedServer, ScriptedLink]:
    server = ScriptedServer()
    link = ScriptedLink(server)
    return ServedVectorClient(link, n), server, link


def test_entries_start_step_and_carry_ends_into_the_next_act():
    client, server, _ = client_and_server()
    obs = np.zeros((3, 2), np.float32)
    assert list(client.act(obs)) == [0, 1, 2]
    first = server.batches[-1]
    assert all(e.start and e.reward is None for e in first) and len({e.episode_id for e in first}) == 3
    client.step([1.0, 2.0, 3.0], obs + 1, [False, True, False], [False, False, False])
    client.act(obs + 2)
    second = server.batches[-1]
    assert [e.ends for e in second] == [True, False, False, False]  # copy 1's END first
    end = second[0]
    assert end.episode_id == first[1].episode_id and end.terminated and end.reward == 2.0
    assert end.observation.tolist() == [1.0, 1.0]                  # the final observation
    assert [e.start for e in second[1:]] == [False, True, False]    # copy 1 starts anew
    assert second[2].episode_id != first[1].episode_id
    assert [e.reward for e in second[1:]] == [1.0, None, 3.0]
    assert list(client.weights_seq_nos) == [7, 7, 7]


def test_a_lost_episode_reconnects_and_starts_every_copy_again():
    client, server, link = client_and_server()
    obs = np.zeros((3, 2), np.float32)
    client.act(obs)
    client.step([1.0] * 3, obs, [False] * 3, [False] * 3)
    server.fail_next = ServerError("episode lost: 'x': a daemon restart lost it", retry=True)
    client.act(obs)
    assert link.connects == 2 and client.lost_episodes == 3
    assert all(e.start for e in server.batches[-1]) and len(server.batches[-1]) == 3


def test_a_refusal_raises_and_is_not_retried():
    client, server, link = client_and_server()
    server.fail_next = ServerError("episode 'x': observation does not fit")
    with pytest.raises(ServerError, match="does not fit"):
        client.act(np.zeros((3, 2), np.float32))
    assert link.connects == 1


def test_argument_rules():
    client, _, _ = client_and_server()
    obs = np.zeros((3, 2), np.float32)
    with pytest.raises(ValueError, match="mode="):
        client.act(obs, explore=False)
    client.act(obs)
    with pytest.raises(ValueError, match="before step"):
        client.act(obs)
    client.step([0.0] * 3, obs, [False] * 3, [False] * 3)
    with pytest.raises(InvalidValue, match="obs"):
        client.act(np.zeros((2, 2), np.float32))  # two rows for three copies
    with pytest.raises(ValueError, match="agent_prefix"):
        connect_vector("tcp://127.0.0.1:1", 2, inference="server", agent_prefix="a")
    with pytest.raises(ValueError, match="mode= and policy="):
        connect_vector("tcp://127.0.0.1:1", 2, mode="evaluate")
    with pytest.raises(ValueError, match="inference must be"):
        connect_vector("tcp://127.0.0.1:1", 2, inference="gpu")
    with pytest.raises(ValueError, match="num_envs"):
        connect_vector("tcp://127.0.0.1:1", 0, inference="server")


def test_truncate_ends_every_open_episode_with_the_last_observations():
    """A driver resets its env mid-episode (run_env called again): every copy's episode ends
    truncated at its last step, and the next act starts new ones."""
    client, server, _ = client_and_server()
    obs = np.zeros((3, 2), np.float32)
    client.act(obs)
    first = server.batches[-1]
    client.step([1.0, 2.0, 3.0], obs + 1, [False, True, False], [False] * 3)  # copy 1 ends
    client.truncate()
    client.act(obs + 5)
    ends, rest = server.batches[-1][:3], server.batches[-1][3:]
    assert [e.ends for e in ends] == [True] * 3 and [e.truncated for e in ends] == [False, True, True]
    assert [e.episode_id for e in ends] == [first[1].episode_id, first[0].episode_id, first[2].episode_id]
    assert [e.reward for e in ends] == [2.0, 1.0, 3.0] and all(e.observation.tolist() == [1.0, 1.0] for e in ends)
    assert all(e.start for e in rest) and not {e.episode_id for e in rest} & {e.episode_id for e in first}
    with pytest.raises(ValueError, match="pending"):
        client.truncate()


class AgentLink:
    """ServedAgent's TCP verbs, recorded."""

    config, generation = CONFIG, 1

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def _with_retry(self, fn):
        return fn()

    def send_message(self, msg) -> None:
        pass

    def start(self, eid, obs, evaluate, policy):
        self.calls.append(("start", eid, list(obs)))
        return 0, 7

    def step(self, eid, reward, obs):
        self.calls.append(("step", eid, reward, list(obs)))
        return 1, 7

    def end(self, eid, reward, obs, terminated, truncated):
        self.calls.append(("end", eid, reward, list(obs), terminated, truncated))


def test_a_served_agent_truncates_its_open_episode():
    from rlinkd.client_lib.served import ServedAgent
    link = AgentLink()
    agent = ServedAgent(link)  # type: ignore[arg-type]
    agent.truncate()           # no episode: nothing
    agent.act(np.zeros(2, np.float32))
    agent.step(1.5, np.ones(2, np.float32), False, False)
    agent.truncate()
    agent.act(np.full(2, 3.0, np.float32))
    (_, eid, _), (end, ended, reward, final, term, trunc), (start, new, _) = link.calls
    assert (end, ended, reward, final, term, trunc) == ("end", eid, 1.5, [1.0, 1.0], False, True)
    assert start == "start" and new != eid


def test_a_served_agent_truncates_with_the_open_episodes_own_last_observation():
    """After an episode ended, the next one's truncation ENDs with its own last observation
    (not the ended one's); an act not stepped yet cannot be truncated."""
    from rlinkd.client_lib.served import ServedAgent
    link = AgentLink()
    agent = ServedAgent(link)  # type: ignore[arg-type]
    agent.act(np.zeros(2, np.float32))
    agent.step(1.0, np.full(2, 4.0, np.float32), True, False)     # episode 1 ends
    agent.act(np.full(2, 5.0, np.float32))
    with pytest.raises(ValueError, match="pending"):
        agent.truncate()
    agent.step(1.0, np.full(2, 6.0, np.float32), False, False)
    agent.truncate()
    ends = [c for c in link.calls if c[0] == "end"]
    assert [(c[3], c[4], c[5]) for c in ends] == [([4.0, 4.0], True, False), ([6.0, 6.0], False, True)]
