"""A real daemon with a recurrent (GRU) policy: every client acts with it and its fragments
pass the collector's state checks -- client_lib's Agent over TCP and over shared memory,
the many-agent and vector clients, server-side actions, and the raw RLlink JSON client of
docs/recurrent.md (its code run as printed) -- while a fragment with a state of the wrong
shape is an ERROR to that client only. Acting and data only: nothing here waits for
training (sampling.force_on_policy is off)."""
from __future__ import annotations

import re

import numpy as np
import pytest

from rlinkd.client_lib import connect
from rlinkd.client_lib.multi import connect_multi, connect_vector
from tests.conftest import DaemonPool
from tests.helpers import REPO, raw_connect, wait_for

pytestmark = [pytest.mark.process, pytest.mark.timeout(120)]

L = 4
RECURRENT = ("--set", "ppo.recurrent=gru", "--set", "ppo.recurrent_size=8", "--set", f"ppo.max_seq_len={L}",
             "--set", "sampling.force_on_policy=false", "--set", "sampling.env_steps_per_sample=30")
STEPS = 90


class Env:
    """Episodes of 13 steps of small observations inside CartPole's bounds."""

    def __init__(self, seed: int = 0) -> None:
        self.rng, self.t = np.random.default_rng(seed), 0

    def reset(self) -> np.ndarray:
        self.t = 0
        return self.rng.uniform(-0.05, 0.05, 4).astype(np.float32)

    def step(self, action) -> tuple[np.ndarray, float, bool, bool]:
        self.t += 1
        return self.rng.uniform(-0.05, 0.05, 4).astype(np.float32), 1.0, self.t >= 13, False


@pytest.fixture(scope="module")
def d(tmp_path_factory):
    """One daemon for the module (starting one is most of a test's time)."""
    pool = DaemonPool(tmp_path_factory.mktemp("recurrent"))
    yield pool.start(*RECURRENT)
    pool.close()


def drive(agent, steps: int = STEPS) -> None:
    env = Env()
    obs = env.reset()
    for _ in range(steps):
        obs_next, reward, terminated, truncated = env.step(agent.act(obs))
        agent.step(reward, obs_next, terminated, truncated)
        obs = env.reset() if terminated or truncated else obs_next
    agent.close()


def docs_client():
    """The raw client of docs/recurrent.md, defined by running its code block."""
    source = re.findall(r"```python\n(.*?)```", (REPO / "docs" / "recurrent.md").read_text(), re.S)[-1]
    scope: dict = {}
    exec(compile(source, "docs/recurrent.md", "exec"), scope)
    return scope["run"]


def test_every_client_acts_with_a_recurrent_policy(d):
    before, refused = d.status()["env_steps"], invalid_episodes(d)
    tcp, shm = f"tcp://127.0.0.1:{d.port}", f"shm:{d.state_dir}"
    drive(connect(tcp))
    drive(connect(shm))
    drive(connect(tcp, inference="server"))
    multi, env = connect_multi(tcp), Env()
    for i in range(STEPS // 2):
        multi.act({"a": env.reset(), "b": env.reset()})
        multi.step({"a": 1.0, "b": 1.0}, {"a": env.reset(), "b": env.reset()}, terminated={"b": i % 7 == 6})
    multi.close()
    vector = connect_vector(shm, num_envs=3)
    for t in range(STEPS // 3):
        vector.act(np.zeros((3, 4), np.float32))
        vector.step(np.ones(3), np.zeros((3, 4), np.float32), terminated=np.array([t % 5 == 4, False, False]))
    vector.close()
    docs_client()(Env(), ("127.0.0.1", d.port), total_steps=STEPS)
    total = before + 6 * STEPS - 1  # (the served agent's last step: its reward went with the close)
    status = wait_for(lambda: (s := d.status())["env_steps"] >= total and s, 20,
                      what=f"{total} env steps counted")
    assert status["protocol_errors_by_kind"]["invalid_episode"] == refused, status
    assert status["policies"]["default"]["recurrent"] == {"cell": "gru", "recurrent_size": 8,
                                                          "max_seq_len": L}


def invalid_episodes(d) -> int:
    return d.status()["protocol_errors_by_kind"]["invalid_episode"]


def test_a_wrong_state_is_an_error_to_that_client_only(d):
    before = invalid_episodes(d)
    scope = docs_client().__globals__                     # the page's send / recv
    bad = raw_connect(d.port)
    scope["send"](bad, {"type": "PING"})
    scope["recv"](bad)
    frag = {"obs": [[0.0] * 4] * 7, "actions": [0] * 6, "rewards": [1.0] * 6, "is_terminated": True,
            "is_truncated": False, "state_in": [[0.0] * 8]}  # 6 steps, L = 4: two rows needed
    scope["send"](bad, {"type": "EPISODES", "episodes": [frag], "env_steps": 6})
    with pytest.raises(RuntimeError, match=r"state_in has shape \(1, 8\), expected \(2, 8\)"):
        scope["recv"](bad)
    bad.close()
    drive(connect(f"tcp://127.0.0.1:{d.port}"), steps=30)       # everyone else is served on
    assert invalid_episodes(d) == before + 1
