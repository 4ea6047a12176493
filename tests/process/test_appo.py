"""APPO against a real daemon (``--set learner.algorithm=appo``): two CartPole clients (TCP
and shared memory) never wait for an update, their steps from older weights are corrected
by V-trace (or dropped past ``sampling.max_policy_lag``), and they reach a mean return of
150 within a test-sized budget."""
from __future__ import annotations

import pytest

from tests.helpers import learn_over_both_transports

pytestmark = [pytest.mark.process, pytest.mark.timeout(300)]

APPO = ("--set", "learner.algorithm=appo")
TARGET_RETURN = 150.0
LEARN_BUDGET_S = 180.0


def test_appo_learns_cartpole_and_its_clients_never_wait(daemon_factory):
    d = daemon_factory(*APPO)
    returns = learn_over_both_transports(d, TARGET_RETURN, LEARN_BUDGET_S)
    assert all(len(r) > 20 for r in returns.values()), "both transports took part"
    status = d.status()
    learner = status["learner"]
    assert learner["algorithm"] == "appo" and learner["updates"] >= 2
    assert learner["policy_lag_max"] is not None  # trained on steps of older versions too
