"""Server-side actions through the whole daemon in one process: raw serving messages and
their errors, client_lib's server-inference agent on both transports, evaluation episodes."""
from __future__ import annotations

import time

import gymnasium as gym
import pytest

from rlinkd.client_lib import connect
from rlinkd.client_lib.multi import connect_vector
from rlinkd.client_lib.runner import run_env
from rlinkd.client_lib.protocol import codec
from rlinkd.client_lib.protocol import serving as s
from rlinkd.client_lib.transport import RLlinkClient, ServerError
from rlinkd.daemon.config import load_config
from rlinkd.daemon.inference.link import COALESCE_S
from rlinkd.daemon.inference.netnative import native_module
from rlinkd.daemon.inprocess import InProcessDaemon
from rlinkd.daemon.roster import ROLES
from tests.helpers import wait_for

OBS = [0.01, 0.02, 0.03, 0.04]
SETTLE_S = 12 * COALESCE_S


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serving")
    cfg = load_config(None, [("daemon", "state_dir", str(tmp / "state")), ("server", "port", 0),
                             ("server", "max_agents_per_connection", 4),
                             ("sampling", "env_steps_per_sample", 200),
                             ("sampling", "train_batch_size", 400), ("ppo", "minibatch_size", 100)])
    d = InProcessDaemon(cfg).start()
    yield d
    assert d.stop() == {role: 0 for role in ROLES}


def settled_status(daemon) -> dict:
    """``status`` once the step counts have not moved for SETTLE_S (earlier tests' served
    steps, queued in the role's link up to COALESCE_S, have landed), within 10 s."""
    seen: list = []

    def settled():
        st = status(daemon)
        seen.append((time.monotonic(), st["env_steps"], st["episodes"], st))
        first = next(i for i, (_, steps, eps, _) in enumerate(seen) if (steps, eps) == seen[-1][1:3])
        return st if seen[-1][0] - seen[first][0] >= SETTLE_S else None
    return wait_for(settled, 10, what="step counts to settle")


def play_episodes(agent, episodes: int, seed: int) -> None:
    """Whole CartPole episodes through ``agent`` (act, step, reset on done)."""
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=seed)
    for _ in range(episodes):
        done = False
        while not done:
            obs2, r, term, trunc, _ = env.step(agent.act(obs))
            agent.step(r, obs2, term, trunc)
            obs, done = obs2, term or trunc
        obs, _ = env.reset()


def tcp(daemon, direct: bool = False) -> RLlinkClient:
    """A raw connection; ``direct``: handed to the inference role first (SERVE_DIRECT)."""
    c = RLlinkClient(f"tcp://127.0.0.1:{daemon.listening.port}").connect()
    if direct:
        c.request(s.ServeDirect(), s.ServeDirectReady)
    return c


def status(daemon) -> dict:
    with RLlinkClient(f"unix://{daemon.listening.unix_socket}") as c:
        return c.status()


@pytest.mark.parametrize("direct", [False, True], ids=["first-message", "serve-direct"])
def test_raw_messages_get_actions_and_record_steps(daemon, direct):
    before = status(daemon)["env_steps"]
    c = tcp(daemon, direct)
    started = c.request(s.StartEpisode(), s.EpisodeStarted)
    eid = started.episode_id
    assert started.policy_id == "default"
    first = c.request(s.GetAction(eid, OBS), s.Action)
    assert first.action in (0, 1) and first.episode_id == eid and first.weights_seq_no >= 0
    c.send(s.LogReturns(eid, 0.5))
    c.send(s.LogReturns(eid, 0.5))
    assert c.request(s.Step(eid, 1.0, OBS), s.Action).action in (0, 1)
    c.send(s.EndEpisode(eid, OBS, terminated=True))
    batch = c.request(s.StepBatch((s.BatchEntry("a", OBS, start=True), s.BatchEntry("b", OBS, start=True))),
                      s.Actions)
    assert len(batch.actions) == 2 and len(set(batch.weights_seq_nos)) == 1
    batch = c.request(s.StepBatch((s.BatchEntry("a", OBS, reward=1.0),
                                   s.BatchEntry("b", OBS, reward=1.0, truncated=True))), s.Actions)
    assert batch.actions[1] is None and batch.weights_seq_nos[1] == -1
    c.close()
    wait_for(lambda: status(daemon)["env_steps"] >= before + 3, 10, what="served steps reach the collector")


@pytest.mark.parametrize("messages, words", [
    ([s.GetAction("nope", OBS)], "unknown episode"),
    ([s.StartEpisode("x"), s.StartEpisode("x")], "already open"),
    ([s.StartEpisode("x"), s.EndEpisode("x", OBS), s.GetAction("x", OBS)], "already ended"),
    ([s.StartEpisode("x"), s.GetAction("x", [1, 2])], "observation"),
    ([s.StartEpisode("x"), s.Step("x", 1.0, OBS)], "before its first action"),
    ([s.StartEpisode(policy_id="nobody")], "unknown policy"),
    ([s.StartEpisode(f"e{i}") for i in range(5)], "max_agents_per_connection"),
    ([s.StepBatch((s.BatchEntry("q", OBS, reward=1.0),))], "unknown episode"),
])
@pytest.mark.parametrize("direct", [False, True], ids=["first-message", "serve-direct"])
def test_errors_go_to_that_client_only(daemon, messages, words, direct):
    other = tcp(daemon, direct)
    oid = other.request(s.StartEpisode(), s.EpisodeStarted).episode_id
    c = tcp(daemon, direct)
    with pytest.raises(ServerError, match=words):
        for msg in messages:
            c.send(msg)
            if isinstance(msg, (s.StartEpisode, s.GetAction, s.Step, s.StepBatch)):
                c.recv()
    c.close()
    assert other.request(s.GetAction(oid, OBS), s.Action).action in (0, 1)  # unaffected
    other.close()


def test_a_serving_connection_is_the_roles_from_its_first_serving_message(daemon):
    """With or without SERVE_DIRECT a connection is handed to the inference role at its first
    serving message, with what the collector had read of it: the role answers what follows
    and refuses what is not serving."""
    before = status(daemon)["inference"].get("direct_handed_over", 0)
    c = tcp(daemon, direct=True)
    assert c.request(s.StartEpisode("p"), s.EpisodeStarted).episode_id == "p"
    c.ping()  # PING is answered on a serving connection too
    with pytest.raises(ServerError, match="not accepted on a serving connection"):
        c.get_config()
    c.close()
    c = tcp(daemon)
    c.get_config()  # (the collector's until its first serving message)
    c.request(s.StartEpisode("q"), s.EpisodeStarted)
    with pytest.raises(ServerError, match="SERVE_DIRECT is not accepted on a serving connection"):
        c.request(s.ServeDirect(), s.ServeDirectReady)
    c.close()
    c = tcp(daemon)
    assert c.sock is not None  # (one write: the collector reads every frame at once)
    c.sock.sendall(codec.encode(s.ServeDirect()) + codec.encode(s.StartEpisode("r"))
                   + codec.encode(s.GetAction("r", OBS)))
    assert isinstance(c.recv(), s.ServeDirectReady)
    assert c.recv().episode_id == "r"  # type: ignore[attr-defined]
    assert isinstance(c.recv(), s.Action)
    c.ping()  # (a frame carried twice would be answered first)
    c.close()
    c = tcp(daemon)
    assert c.sock is not None
    c.sock.sendall(codec.encode(s.StartEpisode("t")) + codec.encode(s.GetAction("t", OBS))
                   + codec.encode(s.Step("t", 1.0, OBS)))
    assert c.recv().episode_id == "t"  # type: ignore[attr-defined]
    assert isinstance(c.recv(), s.Action) and isinstance(c.recv(), s.Action)
    c.ping()
    c.close()
    assert status(daemon)["inference"]["direct_handed_over"] == before + 4


def test_a_closed_direct_connection_releases_its_lanes_and_its_steps_train(daemon):
    before = status(daemon)
    c = tcp(daemon, direct=True)
    eid = c.request(s.StartEpisode(), s.EpisodeStarted).episode_id
    c.request(s.GetAction(eid, OBS), s.Action)
    for _ in range(20):
        c.request(s.Step(eid, 1.0, OBS), s.Action)
    wait_for(lambda: status(daemon)["inference"]["lanes_open"] >= 1, 10, what="the direct episode open")
    c.close()  # mid-episode: the role ends it, truncated
    wait_for(lambda: (st := status(daemon))["inference"]["lanes_open"] == 0
             and st["inference"]["direct_connections"] <= before["inference"].get("direct_connections", 0)
             and st["env_steps"] >= before["env_steps"] + 20
             and st["episodes"] >= before["episodes"] + 1, 10,
             what="the lane released, the connection gone, the truncated episode's steps counted")
    assert status(daemon)["inference"]["direct_handed_over"] > before["inference"].get("direct_handed_over", 0)


@pytest.mark.parametrize("transport", ["tcp", "unix"])
def test_client_lib_server_inference_trains(daemon, transport):
    address = (f"tcp://127.0.0.1:{daemon.listening.port}" if transport == "tcp"
               else f"unix://{daemon.listening.unix_socket}")
    before = status(daemon)
    agent = connect(address, inference="server")
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=0)
    seqs = []
    for _ in range(900):
        action = agent.act(obs)
        seqs.append(agent.weights_seq_no)
        obs2, r, term, trunc, _ = env.step(action)
        agent.step(r, obs2, term, trunc)
        obs = env.reset()[0] if term or trunc else obs2
    agent.close()
    assert seqs == sorted(seqs) and seqs[-1] > seqs[0]  # trained on, versions only go up
    after = wait_for(lambda: (st := status(daemon))["env_steps"] >= before["env_steps"] + 800
                     and st["inference"].get("actions", 0) >= 900 and st["inference"]["lanes_open"] == 0
                     and st, 15, what="served steps counted, actions reported, the lane released")
    inf = after["inference"]
    assert inf["batch_sizes"] and inf["backends"]["default"]


@pytest.mark.parametrize("transport", ["tcp", "unix"])
def test_evaluation_episodes_train_nothing(daemon, transport):
    address = (f"tcp://127.0.0.1:{daemon.listening.port}" if transport == "tcp"
               else f"unix://{daemon.listening.unix_socket}")
    agent = connect(address, inference="server", mode="evaluate")
    before = settled_status(daemon)
    play_episodes(agent, 3, seed=1)
    agent.close()
    after = settled_status(daemon)
    assert after["env_steps"] == before["env_steps"] and after["episodes"] == before["episodes"]


@pytest.mark.parametrize("inference", ["client", "server"])
@pytest.mark.parametrize("transport", ["tcp", "unix"])
def test_evaluation_clients_report_returns_and_metrics(daemon, transport, inference):
    address = (f"tcp://127.0.0.1:{daemon.listening.port}" if transport == "tcp"
               else f"unix://{daemon.listening.unix_socket}")
    agent = connect(address, inference=inference, mode="evaluate")
    before = settled_status(daemon)
    play_episodes(agent, 2, seed=2)
    agent.log_metric(f"{transport}_{inference}/fps", 60.0)
    agent.close()
    after = wait_for(lambda: (st := status(daemon))["eval"]["episodes"] >= before["eval"]["episodes"] + 2
                     and f"{transport}_{inference}/fps" in st["client_metrics"] and st, 10,
                     what="evaluation episodes and the metric reported")
    assert after["env_steps"] == before["env_steps"] and after["episodes"] == before["episodes"]
    assert after["eval"]["policies"]["default"]["episode_return_mean"] > 0
    assert after["client_metrics"][f"{transport}_{inference}/fps"]["last"] == 60.0


def test_explore_false_means_evaluate_and_a_training_agent_refuses_it(daemon):
    address = f"tcp://127.0.0.1:{daemon.listening.port}"
    agent = connect(address, explore=False)
    assert agent.evaluate
    agent.close()
    with pytest.raises(ValueError, match="evaluate"):
        connect(address, explore=False, mode="train")


@pytest.mark.parametrize("transport", ["tcp", "unix"])
def test_vector_client_server_inference_trains(daemon, transport):
    """connect_vector(..., inference="server"): 4 CartPoles, one round trip per act for all."""
    address = (f"tcp://127.0.0.1:{daemon.listening.port}" if transport == "tcp"
               else f"unix://{daemon.listening.unix_socket}")
    before = status(daemon)
    env = gym.make_vec("CartPole-v1", num_envs=4, vectorization_mode="sync",  # (episodes end even
                       vector_kwargs={"autoreset_mode": "SameStep"}, max_episode_steps=100)  # once it
    client = connect_vector(address, 4, inference="server")  # balances: earlier tests train it)
    requests = before["inference"].get("requests", 0)
    stats = run_env(env, client, steps=1200, seed=0)
    client.close()
    assert stats.steps == 1200 and stats.episodes > 0
    after = wait_for(lambda: (st := status(daemon))["env_steps"] >= before["env_steps"] + 1100
                     and st["episodes"] >= before["episodes"] + stats.episodes
                     and st["inference"].get("requests", 0) - requests >= 1200  # 1 per copy and step
                     and st["inference"]["lanes_open"] == 0 and st, 15,
                     what="the vector client's steps, episodes and requests counted, lanes released")
    fours = after["inference"]["batch_sizes"].get("<=4", 0) - before["inference"]["batch_sizes"].get("<=4", 0)
    assert fours >= 250  # 300 acts of 4 copies, each group served in one forward pass


@pytest.mark.parametrize("transport", ["tcp", "unix"])
def test_a_served_vector_client_in_evaluate_mode_trains_nothing(daemon, transport):
    address = (f"tcp://127.0.0.1:{daemon.listening.port}" if transport == "tcp"
               else f"unix://{daemon.listening.unix_socket}")
    before = status(daemon)
    env = gym.make_vec("CartPole-v1", num_envs=3, vectorization_mode="sync",
                       vector_kwargs={"autoreset_mode": "SameStep"})
    client = connect_vector(address, 3, inference="server", mode="evaluate")
    stats = run_env(env, client, episodes=6, seed=4)
    client.close()
    after = wait_for(lambda: (st := status(daemon))["eval"]["episodes"] >= before["eval"]["episodes"] + 6
                     and st, 15, what="the evaluation episodes reported")
    assert stats.episodes >= 6
    assert after["env_steps"] == before["env_steps"] and after["episodes"] == before["episodes"]


@pytest.mark.skipif(native_module() is None, reason="the _native extension is not built")
def test_the_status_lists_the_native_parts_serving(daemon):
    served_once(daemon)
    inf = wait_for(lambda: (st := status(daemon))["inference"].get("backends") and st["inference"], 15,
                   what="the inference role's report")
    assert {"scan", "direct"} <= set(inf["native_parts"])  # (net and step: where auto timed native fastest)
    assert ("net" in inf["native_parts"]) == ("native" in inf["backends"]["default"])


def served_once(daemon) -> None:
    """One action over a direct connection (the role chooses its backend at its first weights)."""
    c = tcp(daemon, direct=True)
    eid = c.request(s.StartEpisode(), s.EpisodeStarted).episode_id
    assert c.request(s.GetAction(eid, OBS), s.Action).action in (0, 1)
    c.close()
