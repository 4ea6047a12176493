"""APPO's pacing through the whole daemon in one process (``appo.max_lead_steps``): the
connector reports the steps waiting for the learner, the collector holds sampling clients
while they exceed the limit, so the connector drops (almost) nothing; without pacing the
same fast client outruns this in-process learner and most of its steps are dropped."""
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

STEPS = 6000


def status(d: InProcessDaemon) -> dict:
    with RLlinkClient(f"unix://{d.listening.unix_socket}") as c:
        return c.status()


def accounted(s: dict) -> dict | None:
    """The status once the connector's (periodic) stats cover every step sent."""
    c = s["connector"]
    done = c.get("trained_steps", 0) + c.get("dropped_steps", 0) + c.get("buffered_steps", 0)
    return s if done >= STEPS else None


def run_appo(tmp_path, lead: int) -> dict:
    cfg = load_config(None, [("daemon", "state_dir", str(tmp_path / f"state{lead}")), ("server", "port", 0),
                             ("learner", "algorithm", "appo"), ("sampling", "force_on_policy", False),
                             ("sampling", "env_steps_per_sample", 100), ("sampling", "train_batch_size", 400),
                             ("ppo", "num_epochs", 4), ("ppo", "minibatch_size", 100),
                             ("appo", "max_lead_steps", lead)])
    d = InProcessDaemon(cfg).start()
    try:
        agent = connect(f"unix://{d.listening.unix_socket}")  # (a shared-memory ring)
        env = gym.make("CartPole-v1")
        obs, _ = env.reset(seed=0)
        for _ in range(STEPS):
            obs2, reward, term, trunc, _ = env.step(agent.act(obs))
            agent.step(reward, obs2, term, trunc)
            obs = env.reset()[0] if term or trunc else obs2
        agent.close()
        return wait_for(lambda: accounted(status(d)), 30, what="every step trained, dropped or buffered")
    finally:
        assert d.stop() == {role: 0 for role in ROLES}


@pytest.mark.timeout(180)
def test_paced_appo_clients_wait_for_the_learner_instead_of_sampling_steps_it_drops(tmp_path):
    paced = run_appo(tmp_path, lead=400)
    free = run_appo(tmp_path, lead=0)
    assert paced["paced_samples"] > 0 and free["paced_samples"] == 0
    # paced: nothing sent is wasted (only steps older than sampling.max_policy_lag versions
    # could still be dropped), and the learner trains on more of them
    assert paced["connector"]["dropped_steps"] <= 0.1 * STEPS, paced["connector"]
    assert free["connector"]["dropped_steps"] >= 0.3 * STEPS, free["connector"]
    assert paced["learner"]["updates"] > free["learner"]["updates"] >= 1


@pytest.mark.timeout(120)
def test_samples_of_a_whole_batch_are_not_held_when_the_learner_keeps_up(tmp_path):
    """A TCP client whose every sample is one whole train batch: the connector reads it and
    builds a batch in the same turn, so its lag is 0 before and after. It must still report
    (the pacer counts steps ingested since the last report as waiting): otherwise every
    sample after the first would wait sampling.max_wait_for_batch_s (here 3 s)."""
    cfg = load_config(None, [("daemon", "state_dir", str(tmp_path / "state")), ("server", "port", 0),
                             ("learner", "algorithm", "appo"), ("sampling", "force_on_policy", False),
                             ("sampling", "env_steps_per_sample", 256), ("sampling", "train_batch_size", 256),
                             ("sampling", "max_wait_for_batch_s", 3.0), ("ppo", "num_epochs", 1),
                             ("ppo", "minibatch_size", 256), ("ppo", "hidden_sizes", [16]),
                             ("appo", "max_lead_steps", 256)])
    d = InProcessDaemon(cfg).start()
    try:
        agent = connect(f"tcp://127.0.0.1:{d.listening.port}")
        env = gym.make("CartPole-v1")
        obs, _ = env.reset(seed=0)
        held_s = 0.0
        for k in range(8):  # 8 samples, each after the learner trained on the one before
            wait_for(lambda k=k: (status(d)["learner"].get("updates") or 0) >= k, 20,
                     interval_s=0.05, what="the learner done with the last sample")
            started = time.monotonic()
            for _ in range(256):
                obs2, reward, term, trunc, _ = env.step(agent.act(obs))
                agent.step(reward, obs2, term, trunc)
                obs = env.reset()[0] if term or trunc else obs2
            held_s += time.monotonic() - started
        agent.close()
    finally:
        assert d.stop() == {role: 0 for role in ROLES}
    assert held_s < 8 * 3.0 / 2, f"8 samples took {held_s:.1f} s: held for max_wait_for_batch_s"
