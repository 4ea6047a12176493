"""Recurrent PPO learning through a real daemon: an LSTM policy on CartPole with the
velocities hidden (tests/tasks/cartpole_novel.py) learns from client_lib agents over TCP and
over shared memory, and from server-side actions (the inference role keeps each served
episode's state); APPO with memory trains; SIGTERM then a restart resumes from the
checkpoint and the next fragments still train. The whole data path of issue 34 -- the
clients' state per agent, the collector's "state_in" checks, HAS_STATE rows on the grid,
the connector's sequences, the learner's truncated BPTT -- in one daemon, test-sized."""
from __future__ import annotations

import threading

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from rlinkd.client_lib.policy import decode_onnx
from rlinkd.client_lib.transport import RLlinkClient
from rlinkd.daemon.checkpoint import store
from tests.helpers import learn_with_clients, play_env, wait_for
from tests.tasks.cartpole_novel import ACTION_SPACE_TOML, ID, OBSERVATION_SPACE_TOML

pytestmark = [pytest.mark.process, pytest.mark.timeout(240)]

CONFIG = f"""
[env]
observation_space = {OBSERVATION_SPACE_TOML}
action_space = {ACTION_SPACE_TOML}

[sampling]
env_steps_per_sample = 128
train_batch_size = 512

[ppo]
lr = 0.003
gae_lambda = 0.98
normalize_observations = true
num_epochs = 6
minibatch_size = 128
hidden_sizes = [32]
recurrent = "lstm"
recurrent_size = 32
max_seq_len = 16
"""
RANDOM_RETURN = 22.0      # a uniform random policy on CartPole
TARGET_RETURN = 100.0     # unloaded: ~12,000 env steps, ~12 s (feed-forward: ~60 at 16,000)
SERVED_TARGET_RETURN = 80.0  # one round trip per action: fewer steps per second
LEARN_BUDGET_S = 90.0     # generous for a busy machine


def start(daemon_factory, tmp_path, *args: str):
    config = tmp_path / "memory.toml"
    config.write_text(CONFIG)
    return daemon_factory("--config", str(config), *args)


def learn(addresses: dict[str, str], target: float, budget_s: float,
          inference: str = "client") -> dict[str, list[float]]:
    """The hidden-velocity task's clients until one's mean return over 20 episodes reaches
    ``target`` (``inference`` "server": server-side actions)."""
    return learn_with_clients(addresses, target, budget_s, ID, inference=inference)


def evaluate(addresses: dict[str, str], episodes: int, floor: float,
             budget_s: float) -> float:
    """One evaluation client (greedy, sends no steps) per named address until one's first
    ``episodes`` returns sum to ``floor`` per episode, or each has played ``episodes``; the
    best mean of a first ``episodes`` (episodes still to come counted as 0)."""
    returns: dict[str, list[float]] = {name: [] for name in addresses}
    best = lambda: max(sum(r[:episodes]) for r in returns.values()) / episodes  # noqa: E731
    stop = threading.Event()
    threads = [threading.Thread(target=play_env, args=(address, returns[name], stop, i, ID),
                                kwargs={"mode": "evaluate"})
               for i, (name, address) in enumerate(addresses.items())]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: best() >= floor or min(len(r) for r in returns.values()) >= episodes,
                 budget_s, what=f"{episodes} evaluation episodes on each transport")
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    return best()


def both(d) -> dict[str, str]:
    return {"tcp": f"tcp://127.0.0.1:{d.port}", "shm": f"shm:{d.state_dir}"}


def policy_weights(d) -> tuple[int, dict[str, np.ndarray]]:
    """The weights the daemon serves now: (weights_seq_no, the ONNX model's initializers)."""
    with RLlinkClient(f"unix://{d.unix_socket}") as client:
        state = client.get_state()
    model = onnx.load_from_string(decode_onnx(state))
    return state.weights_seq_no, {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}


def assert_clean(d) -> dict:
    status = d.status()
    assert status["protocol_errors_by_kind"]["invalid_episode"] == 0, status["protocol_errors_by_kind"]
    return status


def test_lstm_learns_over_tcp_and_shared_memory_and_resumes_after_sigterm(daemon_factory, tmp_path):
    """Client-side inference; then SIGTERM, a restart on the same state directory: the
    trained LSTM comes back (the daemon serves the very weights it trained; evaluation clients
    leave them as restored) and the next fragments train on (weights_seq_no goes on from where
    it stopped)."""
    d = start(daemon_factory, tmp_path)
    returns = learn(both(d), TARGET_RETURN, LEARN_BUDGET_S)
    assert all(len(r) > 20 for r in returns.values()), "both transports took part"
    seen = assert_clean(d)["weights_seq_no"]
    trained = policy_weights(d)
    assert d.stop() == 0
    final = store.latest_valid(store.checkpoints_dir(d.state_dir))  # (the drain may train once more)
    assert final is not None and final.manifest["reason"] == "shutdown" and final.weights_seq_no >= seen
    before = final.weights_seq_no
    d.proc = None
    d.start()
    assert d.status()["weights_seq_no"] == before
    restored = policy_weights(d)
    if trained[0] == before:  # (else the drain trained once more: nothing to compare with)
        assert restored[1].keys() == trained[1].keys()
        assert all(np.array_equal(restored[1][k], trained[1][k]) for k in trained[1]), "not the trained LSTM"
    evaluate(both(d), 20, 2 * RANDOM_RETURN, LEARN_BUDGET_S)  # (greedy: may be poor this early)
    assert d.status()["weights_seq_no"] == before, "evaluation clients send no training steps"
    learn(both(d), 2 * RANDOM_RETURN, LEARN_BUDGET_S)
    wait_for(lambda: d.status()["weights_seq_no"] >= before + 2, 30, what="updates after the restart")
    assert_clean(d)


def test_lstm_learns_with_server_side_actions(daemon_factory, tmp_path):
    """The inference role acts for client_lib's served clients, the state per served episode."""
    d = start(daemon_factory, tmp_path, "--set", "inference.env_steps_per_sample=128")
    returns = learn(both(d), SERVED_TARGET_RETURN, LEARN_BUDGET_S, inference="server")
    assert all(len(r) > 20 for r in returns.values()), "both transports took part"
    assert_clean(d)


def test_appo_with_an_lstm_trains(daemon_factory, tmp_path):
    """A smaller check: V-trace over sequences, clients that never wait for an update."""
    d = start(daemon_factory, tmp_path, "--set", "learner.algorithm=appo")
    learn(both(d), 3 * RANDOM_RETURN, LEARN_BUDGET_S)
    status = assert_clean(d)
    assert status["learner"]["algorithm"] == "appo" and status["learner"]["updates"] >= 2
