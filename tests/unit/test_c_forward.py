"""The C client's client-side inference agrees with Python's: the actor it interprets from
ATTACHED's network description (``netops.network_json``) gives the dist inputs NumpyNet gives
(a recurrent one also its state_out: LSTM and GRU), and its action choice the greedy actions
and log-probabilities of ``distributions.ActionDist`` (sampled actions: their log-probs,
bounds and moments). Runs the sanitized
client_lib/c/tests/forward_check.c, built here with the client's Makefile."""
from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest

from rlinkd.client_lib.protocol.netnumpy import NumpyNet
from rlinkd.client_lib.protocol.netops import DIST, STATE_OUT, network_json
from rlinkd.client_lib.protocol.policy_spec import PolicySpec
from rlinkd.client_lib.protocol.spaces import space_from_json
from tests.helpers import REPO

C_DIR = REPO / "client_lib" / "c"
SAMPLES = 4000


@pytest.fixture(scope="module")
def checker(c_build):
    return c_build("san/forward_check") / "san" / "forward_check"


def box(shape, low=-1.0, high=1.0) -> dict:
    return {"type": "Box", "shape": list(shape), "low": low, "high": high, "dtype": "float32"}


def make_spec(obs: dict, act: dict, **kw) -> tuple[PolicySpec, np.ndarray]:
    """A spec and weights far from the initial ones (so logits and means are not all ~0)."""
    spec = PolicySpec(space_from_json(obs), space_from_json(act), **kw)
    rng = np.random.default_rng(7)
    flat = spec.init_flat(rng) + rng.normal(0.0, 0.3, spec.n_params()).astype(np.float32)
    parts = spec.split_flat(flat)
    for name, value in parts.items():
        if name.endswith("_std"):
            value[...] = rng.uniform(0.5, 2.0, value.shape)
    return spec, np.concatenate([parts[name].reshape(-1) for name, _ in spec.param_layout()]).astype(np.float32)


def run(checker, tmp_path, spec: PolicySpec, flat: np.ndarray, obs: np.ndarray,
        epsilon: float = -1.0, state: np.ndarray | None = None, samples: int = SAMPLES) -> dict:
    case = {"network": network_json(spec.net, spec.action_components), "weights": flat.tolist(),
            "obs": obs.reshape(-1).tolist(), "rows": len(obs), "obs_size": spec.obs_size,
            "act_size": spec.action_size, "dist_size": spec.dist_size, "samples": samples,
            "epsilon": epsilon, "seed": 11}
    if state is not None:
        case["state"] = state.reshape(-1).tolist()
    path = tmp_path / "case.json"
    path.write_text(json.dumps(case))
    proc = subprocess.run([str(checker), str(path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return {k: np.asarray(v, np.float32) for k, v in json.loads(proc.stdout).items()}


CASES = {
    "cartpole": (box([4], -4.8, 4.8), {"type": "Discrete", "n": 2}, {}),
    "multi_discrete_relu": (box([6]), {"type": "MultiDiscrete", "nvec": [3, 4]},
                            {"activation": "relu", "hidden_sizes": (32, 16)}),
    "gaussian_2d_obs": (box([2, 3]), box([2], -2.0, 2.0), {"hidden_sizes": (16,)}),
    "gaussian_unbounded": (box([3]), {"type": "Box", "shape": [2], "low": None, "high": None,
                                      "dtype": "float32"}, {}),
    "squashed": (box([3]), box([2], [-2.0, 0.0], [2.0, 1.0]),
                 {"box_dist": "squashed_gaussian", "activation": "relu"}),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_c_actor_and_choice_agree_with_python(checker, tmp_path, name):
    obs_space, act_space, kw = CASES[name]
    spec, flat = make_spec(obs_space, act_space, **kw)
    obs = np.random.default_rng(3).normal(0.0, 1.0, (5, spec.obs_size)).astype(np.float32)
    got = run(checker, tmp_path, spec, flat, obs)
    want = NumpyNet(spec, flat, (DIST,)).run({"": obs.reshape(5, *spec.obs_space.shape)})[DIST]
    np.testing.assert_allclose(got["dist"].reshape(want.shape), want, rtol=1e-4, atol=1e-5)
    dist = spec.action_dist
    greedy = got["greedy"].reshape(5, spec.action_size)
    np.testing.assert_allclose(greedy, dist.greedy(want), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got["greedy_logp"], dist.log_prob(want, greedy), rtol=1e-4, atol=1e-4)
    sampled = got["sampled"].reshape(SAMPLES, spec.action_size)
    rows = np.repeat(want[:1], SAMPLES, axis=0)
    np.testing.assert_allclose(got["sampled_logp"], dist.log_prob(rows, sampled), rtol=1e-4, atol=1e-3)
    reference = dist.sample(rows, np.random.default_rng(5))  # the same distribution, numpy's draws
    spread = reference.std(axis=0)  # five standard errors of the two estimates' difference
    assert np.all(np.abs(sampled.mean(axis=0) - reference.mean(axis=0)) <= 5 * spread * np.sqrt(2 / SAMPLES) + 1e-3)
    assert np.all(np.abs(sampled.std(axis=0) - spread) <= 5 * spread / np.sqrt(SAMPLES) + 1e-3)


RECURRENT = {
    "lstm": (box([3]), {"type": "Discrete", "n": 3}, {"recurrent": "lstm", "recurrent_size": 6}),
    "gru": (box([2, 2]), box([2], -2.0, 2.0), {"recurrent": "gru", "recurrent_size": 5,
                                               "hidden_sizes": (16,), "activation": "relu"}),
}


def recurrent_step(checker, tmp_path, spec, flat, obs, state) -> tuple[np.ndarray, np.ndarray]:
    """One step in C, checked against NumpyNet from the same state: C's (dist, state_out)."""
    got = run(checker, tmp_path, spec, flat, obs, state=state, samples=0)
    want = NumpyNet(spec, flat, (DIST,)).run({"": obs.reshape(len(obs), *spec.obs_space.shape)}, state)
    state_out = got["state_out"].reshape(want[STATE_OUT].shape)
    np.testing.assert_allclose(got["dist"].reshape(want[DIST].shape), want[DIST], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(state_out, want[STATE_OUT], rtol=1e-4, atol=1e-5)
    return got["dist"], state_out


@pytest.mark.parametrize("cell", sorted(RECURRENT))
def test_c_recurrent_actor_agrees_with_python(checker, tmp_path, cell):
    """The cell from a nonzero state, then an episode of steps chained from zeros (each fed
    the state_out C gave at the step before): dist inputs and state_out as NumpyNet's."""
    obs_space, act_space, kw = RECURRENT[cell]
    spec, flat = make_spec(obs_space, act_space, **kw)
    rng = np.random.default_rng(5)
    width = spec.net.state_width
    assert width == (12 if cell == "lstm" else 5)
    obs = rng.normal(0.0, 1.0, (4, 8, spec.obs_size)).astype(np.float32)
    recurrent_step(checker, tmp_path, spec, flat, obs[0], rng.normal(0.0, 1.0, (8, width)).astype(np.float32))
    state = np.zeros((8, width), np.float32)
    for step in obs:
        _, new_state = recurrent_step(checker, tmp_path, spec, flat, step, state)
        assert not np.allclose(new_state, state)  # (the state moves: the cell is really run)
        state = new_state


def test_c_epsilon_greedy_matches_the_python_mixture(checker, tmp_path):
    spec, flat = make_spec(box([4]), {"type": "Discrete", "n": 3})
    obs = np.zeros((1, 4), np.float32)
    got = run(checker, tmp_path, spec, flat, obs, epsilon=0.3)
    q = got["dist"].reshape(1, 3)
    best = int(q.argmax())
    freq = np.bincount(got["sampled"].astype(int), minlength=3) / SAMPLES
    expected = np.full(3, 0.1)
    expected[best] += 0.7
    np.testing.assert_allclose(freq, expected, atol=0.03)
    logp = np.where(got["sampled"] == best, np.log(0.8), np.log(0.1))
    np.testing.assert_allclose(got["sampled_logp"], logp, rtol=1e-5)


def test_c_refuses_a_network_it_cannot_run(checker, tmp_path):
    image = {"type": "Box", "shape": [8, 8, 3], "low": 0, "high": 255, "dtype": "uint8"}
    spec, flat = make_spec(image, {"type": "Discrete", "n": 2})
    case = {"network": network_json(spec.net, spec.action_components), "weights": flat.tolist(),
            "obs": [0.0] * spec.obs_size, "rows": 1, "obs_size": spec.obs_size, "act_size": 1,
            "dist_size": 2, "samples": 0, "epsilon": -1, "seed": 1}
    path = tmp_path / "case.json"
    path.write_text(json.dumps(case))
    proc = subprocess.run([str(checker), str(path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3 and proc.stderr.startswith("RLK_E_UNSUPPORTED"), proc.stderr
