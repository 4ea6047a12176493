"""Learning with memory: on CartPole with the velocities hidden (tests/tasks/cartpole_novel.py)
recurrent PPO, trained through the daemon's connector pipeline and learner
(tests/learning_loop.py), learns what the feed-forward policy cannot at the same budget; and
the trained checkpoint exports an ONNX model that acts, state and all, as the numpy network."""
from __future__ import annotations

import io
import json

import gymnasium as gym
import numpy as np
import onnxruntime as ort
import pytest
import torch

from rlinkd.client_lib.protocol import netops
from rlinkd.client_lib.protocol.netnumpy import NumpyNet
from rlinkd.client_lib.protocol.policy_spec import ONNX_INPUT_NAME
from rlinkd.daemon import export
from rlinkd.daemon.checkpoint import store
from rlinkd.daemon.config import PPOConfig, load_config, to_toml
from tests.learning_loop import train
from tests.tasks.cartpole_novel import ID

BUDGET_STEPS = 12_288


def hp(cell: str) -> PPOConfig:
    return PPOConfig(lr=1e-3, gamma=0.99, gae_lambda=0.95, num_epochs=10, minibatch_size=64,
                     hidden_sizes=(64,), recurrent=cell, recurrent_size=32, max_seq_len=16)


def test_the_task_hides_the_velocities():
    env, full = gym.make(ID), gym.make("CartPole-v1")
    obs, _ = env.reset(seed=3)
    state, _ = full.reset(seed=3)
    assert obs.shape == (2,) and env.observation_space.shape == (2,)
    np.testing.assert_array_equal(obs, state[[0, 2]])


@pytest.fixture(scope="module")
def runs():
    return {cell: train(hp(cell), ID, BUDGET_STEPS, seed=0, eval_every_steps=BUDGET_STEPS,
                        eval_episodes=5, stop_when_solved=False) for cell in ("lstm", "none")}


@pytest.mark.slow  # (about 30 s on 2 shared cores: two 12,288-step runs)
def test_recurrent_ppo_learns_what_feed_forward_ppo_cannot(runs):
    memory, plain = runs["lstm"].curve[-1][1], runs["none"].curve[-1][1]
    assert memory >= 60.0, runs["lstm"].curve
    assert memory > 1.5 * plain, (runs["lstm"].curve, runs["none"].curve)


@pytest.mark.slow
def test_a_trained_checkpoint_exports_a_model_that_acts_with_its_state(runs, tmp_path):
    learner = runs["lstm"].learner
    spec, flat = learner.spec, learner.flat_weights()
    buf = io.BytesIO()
    torch.save({"learner": learner.state_dict(), "weights_seq_no": 48}, buf)
    cfg = load_config(None, [("env", "observation_space", spec.obs_space.to_json()),
                             ("env", "action_space", spec.act_space.to_json())])
    files = {"learner.pt": buf.getvalue(), "config.toml": to_toml(cfg).encode(),
             export.POLICY_FILE: json.dumps(export.policy_description(
                 spec.obs_space, spec.act_space, spec)).encode()}
    store.write_checkpoint(store.checkpoints_dir(tmp_path / "state"), files, {"weights_seq_no": 48})
    result = export.export_policy(tmp_path / "p.onnx", tmp_path / "state")
    sidecar = json.loads(result.sidecar_path.read_text())
    assert sidecar["state"]["max_seq_len"] == 16 and sidecar["state"]["shape"] == ["batch", 64]
    session = ort.InferenceSession(str(result.onnx_path))
    net = NumpyNet(spec, flat, (netops.DIST,))
    env = gym.make(ID)
    obs, _ = env.reset(seed=7)
    state = np.zeros((1, spec.state_size), np.float32)       # zeros at the episode start
    for _ in range(200):
        dist, state_out = session.run(None, {ONNX_INPUT_NAME: obs[None], "state_in": state})
        want = net.run({"": obs[None]}, state)
        np.testing.assert_allclose(dist, want[netops.DIST], atol=1e-5, rtol=0)
        np.testing.assert_allclose(state_out, want[netops.STATE_OUT], atol=1e-5, rtol=0)
        obs, _, term, trunc, _ = env.step(int(np.argmax(dist[0])))
        state = state_out
        if term or trunc:
            break
