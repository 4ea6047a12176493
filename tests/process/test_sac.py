"""SAC against a real daemon (``rlinkd serve --set learner.algorithm=sac``) on Pendulum-v1.

- Two client_lib clients (TCP and shared memory) learn to a mean return of -500 (random
  play: about -1,200) within a test-sized budget; pacing (``sac.max_lead_steps``) keeps the
  learner at one update per env step.
- A checkpoint (SIGUSR1) holds the SAC state and, with ``checkpoint.save_replay``, the
  replay buffer: a restarted daemon resumes the weights version, the update count, the
  tuned entropy coefficient and the buffer's transitions.
"""
from __future__ import annotations

import signal

import pytest

from tests.helpers import learn_over_both_transports, wait_for

pytestmark = [pytest.mark.process, pytest.mark.timeout(420)]

SAC = ("--set", "env.id=Pendulum-v1", "--set", "learner.algorithm=sac", "--set", "sac.lr=0.001",
       "--set", "sac.hidden_sizes=[64, 64]", "--set", "sac.learning_starts_steps=200",
       "--set", "sac.max_lead_steps=200", "--set", "checkpoint.save_replay=true")
TARGET_RETURN = -500.0
LEARN_BUDGET_S = 200.0


def test_sac_learns_pendulum_over_both_transports_and_resumes_from_a_checkpoint(daemon_factory):
    d = daemon_factory(*SAC)
    returns = learn_over_both_transports(d, TARGET_RETURN, LEARN_BUDGET_S, "Pendulum-v1", last_n=10)
    assert all(len(r) >= 5 for r in returns.values()), "both transports took part"
    learner = d.status()["learner"]
    assert learner["algorithm"] == "sac" and learner["updates"] > 1000 and learner["ent_coef"] < 1.0

    d.signal(signal.SIGUSR1)
    saved = wait_for(lambda: (s := d.status())["last_checkpoint"] and s, 30, what="a checkpoint")
    saved_learner = saved["learner"]
    assert d.stop() == 0
    d2 = daemon_factory(*SAC, name="state")  # same state dir: resumes it
    resumed = wait_for(lambda: (s := d2.status())["learner"].get("algorithm") and s, 60,
                       what="the resumed SAC learner")
    assert resumed["learner"]["replay_steps"] >= saved_learner["replay_steps"] > 0
    assert resumed["learner"]["updates"] >= saved_learner["updates"] - 300  # (the checkpoint came first)
    assert saved_learner["ent_coef"] < 0.5  # (tuned down from 1.0: a fresh learner would differ)
    assert resumed["learner"]["ent_coef"] == pytest.approx(saved_learner["ent_coef"], rel=0.25)
    assert resumed["weights_seq_no"] >= saved["weights_seq_no"]
