"""Composite spaces under bad input (real daemon, raw sockets): every malformed leaf gets an
ERROR naming its path, is counted, and spares the daemon and other clients; a client that
acts through rlinkd's ONNX never takes a choice its action mask forbids."""
from __future__ import annotations

import base64

import numpy as np
import pytest

from rlinkd.client_lib import connect
from rlinkd.client_lib.protocol.compact import encode_compact
from tests.helpers import peer_closed, raw_connect, raw_recv, raw_send

pytestmark = pytest.mark.process

CONFIG = """
[env]
action_space = { type = "MultiDiscrete", nvec = [3, 2] }
action_mask_key = "action_mask"

[env.observation_space]
type = "Dict"
spaces.image = { type = "Box", shape = [4, 4, 1], dtype = "uint8", low = 0, high = 255 }
spaces.vec = { type = "Box", shape = [2], low = -1.0, high = 1.0 }
spaces.action_mask = { type = "MultiBinary", n = 5 }
"""
IMAGE = np.arange(16, dtype=np.uint8).reshape(4, 4, 1)
ALL_LEGAL = [1, 1, 1, 1, 1]


def step_obs(image=None, vec=(0.5, -0.5), mask=ALL_LEGAL) -> dict:
    return {"image": (IMAGE if image is None else image).tolist(), "vec": list(vec),
            "action_mask": list(mask)}


def episodes(obs=None, actions=([2, 1],), **extra) -> dict:
    obs = obs if obs is not None else [step_obs(), step_obs()]
    ep = {"obs": obs, "actions": list(actions), "rewards": [1.0] * len(actions),
          "is_terminated": True, "is_truncated": False, **extra}
    return {"type": "EPISODES", "episodes": [ep]}


def compact(array, **changes) -> dict:
    return {**encode_compact(np.asarray(array)), **changes}


BAD = {
    "missing key": (episodes(obs=[{"image": IMAGE.tolist(), "vec": [0, 0]}] * 2), 'obs'),
    "extra key": (episodes(obs=[dict(step_obs(), speed=[1.0])] * 2), "unexpected ['speed']"),
    "string in a leaf": (episodes(obs=[step_obs(), dict(step_obs(), vec=["a", "b"])]),
                         'obs["vec"]'),
    "image wrong shape": (episodes(obs=[step_obs(), step_obs(image=np.zeros((3, 4, 1), np.uint8))]),
                          'obs["image"][1]: shape [3, 4, 1], space wants [4, 4, 1]'),
    "pixel out of range": (episodes(obs=[step_obs(), dict(step_obs(), image=[[[300]] * 4] * 4)]),
                           'obs["image"]'),
    "NaN in a float leaf": (episodes(obs={"image": [IMAGE.tolist()] * 2, "action_mask": [ALL_LEGAL] * 2,
                                          "vec": compact(np.array([[0, 0], [np.nan, 0]], np.float32))}),
                            'obs["vec"]: contains NaN'),
    "discrete out of bounds": (episodes(actions=([3, 0],)), "actions"),
    "compact wrong byte length": (episodes(obs={"image": compact(np.stack([IMAGE] * 2),
                                                                 b64=base64.b64encode(b"x" * 31).decode()),
                                                "vec": [[0, 0], [0, 0]],
                                                "action_mask": [ALL_LEGAL] * 2}), "needs 32"),
    "compact unknown dtype": (episodes(obs={"image": compact(np.stack([IMAGE] * 2), dtype="complex64"),
                                            "vec": [[0, 0], [0, 0]], "action_mask": [ALL_LEGAL] * 2}),
                              "unknown compact dtype"),
    "mask forbids the action": (episodes(obs=[step_obs(mask=[1, 1, 0, 1, 1]), step_obs()]),
                                "action mask forbids"),
    "mask allows nothing": (episodes(obs=[step_obs(mask=[0, 0, 0, 1, 1]), step_obs()]),
                            "allows no choice"),
}


@pytest.fixture(scope="module")
def composite_daemon(tmp_path_factory):
    from tests.conftest import DaemonPool
    base = tmp_path_factory.mktemp("composite")
    (base / "c.toml").write_text(CONFIG)
    pool = DaemonPool(base)
    yield pool.start("--config", str(base / "c.toml"))
    pool.close()


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_leaf_gets_an_error_naming_it_and_spares_others(composite_daemon, name):
    frame, expected = BAD[name]
    healthy = raw_connect(composite_daemon.port)
    raw_send(healthy, {"type": "PING"})
    assert raw_recv(healthy)["type"] == "PONG"
    before = composite_daemon.status()["protocol_errors"]
    bad = raw_connect(composite_daemon.port)
    raw_send(bad, frame)
    reply = raw_recv(bad)
    assert reply["type"] == "ERROR" and expected in reply["message"], reply
    assert peer_closed(bad)
    raw_send(healthy, {"type": "PING"})
    assert raw_recv(healthy)["type"] == "PONG"
    assert composite_daemon.status()["protocol_errors"] == before + 1
    healthy.close()


@pytest.mark.parametrize("form", ["per-step", "columnar-compact"])
def test_good_composite_episode_counts_in_both_forms(composite_daemon, form):
    obs = ([step_obs(), step_obs()] if form == "per-step" else
           {"image": compact(np.stack([IMAGE] * 2)), "vec": compact(np.zeros((2, 2), np.float32)),
            "action_mask": [ALL_LEGAL] * 2})
    before = composite_daemon.status()["env_steps"]
    sock = raw_connect(composite_daemon.port)
    raw_send(sock, episodes(obs=obs))
    raw_send(sock, {"type": "PING"})
    assert raw_recv(sock)["type"] == "PONG"
    assert composite_daemon.status()["env_steps"] == before + 1
    sock.close()


def test_an_agent_never_takes_a_masked_choice(composite_daemon):
    agent = connect(f"tcp://127.0.0.1:{composite_daemon.port}", seed=1)
    rng = np.random.default_rng(0)
    seen = np.zeros(5, int)

    def observe() -> dict:
        mask = np.concatenate([rng.permutation([1, 0, 0]), rng.permutation([1, 0])]).astype(np.int8)
        return {"image": rng.integers(0, 256, (4, 4, 1), dtype=np.uint8),
                "vec": rng.uniform(-1, 1, 2).astype(np.float32), "action_mask": mask}
    obs = observe()
    for _ in range(600):
        action, mask = agent.act(obs), obs["action_mask"]
        assert mask[action[0]] == 1 and mask[3 + action[1]] == 1, (mask, action)
        seen[action[0]] += 1
        seen[3 + action[1]] += 1
        obs = observe()
        agent.step(0.0, obs, terminated=False, truncated=False)
    agent.close()
    assert (seen > 0).all()  # every choice was taken when it was the legal one
