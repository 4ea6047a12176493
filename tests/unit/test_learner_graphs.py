"""The learner's captured SGD step (``daemon.learner.graphed``).

Without CUDA: the CPU runs the eager step, and a capture that fails falls back to it (logged
with the reason). With CUDA (marker ``cuda``, ``make gpu-check``): graphed and eager updates
give the same weights within ATOL/RTOL, an MLP and a network with convolutions among them; a
checkpoint round trip; a reload mid-run copies into the graph's tensors without recapture; a
new batch shape is captured anew.
"""
from __future__ import annotations

import numpy as np
import pytest
import structlog
import torch

from rlinkd.client_lib.protocol.policy_spec import PolicySpec
from rlinkd.client_lib.protocol.spaces import Box, Discrete
from rlinkd.daemon.learner import graphed
from rlinkd.daemon.learner.learner import Learner
from tests.unit.test_learner_update import BOX, CARTPOLE, HP, make_batch

ATOL, RTOL = 1e-5, 1e-4
"""Graphed against eager on one GPU: the same kernels in the same order; cuDNN may choose
other convolution algorithms for the capture, hence not bit-for-bit."""
IMAGE = PolicySpec(Box((16, 16, 3), "uint8", 0, 255), Discrete(3), cnn_channels=(8, 16),
                   cnn_kernels=(4, 3), cnn_strides=(2, 1), cnn_dense=32)
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (torch sees none)")


def image_batch(learner: Learner, n: int = 256, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    obs = rng.integers(0, 256, (n, 16, 16, 3), dtype=np.uint8)
    return {"obs": obs, "actions": rng.integers(0, 3, n).astype(np.float32),
            "logp": np.full(n, -np.log(3), np.float32),
            **{k: rng.normal(size=n).astype(np.float32) for k in ("advantages", "value_targets", "values")}}


def test_the_cpu_steps_eagerly():
    learner = Learner(CARTPOLE, HP(), device="cpu")
    assert isinstance(learner.stepper, graphed.EagerStepper)


def test_a_failed_capture_is_logged_and_the_eager_step_runs(monkeypatch):
    calls = []
    stepper = graphed.GraphedStepper(lambda data, idx: calls.append(idx) or idx.float(),
                                     [torch.zeros(3)], "ppo")

    def no_stream(*args, **kwargs):
        raise RuntimeError("operation not permitted when stream is capturing\nmore")
    monkeypatch.setattr(graphed.torch.cuda, "Stream", no_stream)
    with structlog.testing.capture_logs() as logs:
        run = stepper.bind({"x": torch.zeros(4)}, 2)
        assert torch.equal(run(torch.tensor([1, 2])), torch.tensor([1.0, 2.0]))
        stepper.bind({"x": torch.zeros(8)}, 2)  # not tried again
    failed = [e for e in logs if e["event"] == "step_graph_capture_failed"]
    assert len(failed) == 1 and failed[0]["reason"] == "operation not permitted when stream is capturing"
    assert stepper.failed and stepper.captures == 0 and len(calls) == 1


def pair(spec, hp):
    return (Learner(spec, hp, device="cuda", seed=3),
            Learner(spec, hp, device="cuda", seed=3, graphs=False))


def batches(spec, learner, n=3):
    return [image_batch(learner, seed=i) if spec is IMAGE else make_batch(spec, learner, seed=i)
            for i in range(n)]


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("spec", [CARTPOLE, BOX, IMAGE], ids=["mlp", "gaussian", "conv"])
def test_graphed_and_eager_updates_agree(spec):
    graph, eager = pair(spec, HP(num_epochs=2))
    for batch in batches(spec, graph):
        g, e = graph.update(batch), eager.update(batch)
        np.testing.assert_allclose(graph.flat_weights(), eager.flat_weights(), atol=ATOL, rtol=RTOL)
        assert g["approx_kl"] == pytest.approx(e["approx_kl"], abs=1e-6)
    assert graph.stepper.captures == 1 and not graph.stepper.failed


@pytest.mark.cuda
@cuda
def test_a_graphed_checkpoint_resumes_exactly_and_on_the_cpu():
    learner = Learner(CARTPOLE, HP(), device="cuda", seed=1)
    data = batches(CARTPOLE, learner, 3)
    for batch in data[:2]:
        learner.update(batch)
    state = learner.state_dict()
    resumed = Learner(CARTPOLE, HP(), device="cuda", seed=9)
    resumed.load_state_dict(state)
    on_cpu = Learner(CARTPOLE, HP(), device="cpu", seed=9)
    on_cpu.load_state_dict(state)
    for other in (resumed, on_cpu):
        np.testing.assert_array_equal(other.flat_weights(), learner.flat_weights())
    learner.update(data[2])
    resumed.update(data[2])
    on_cpu.update(data[2])
    np.testing.assert_allclose(resumed.flat_weights(), learner.flat_weights(), atol=ATOL, rtol=RTOL)
    np.testing.assert_allclose(on_cpu.flat_weights(), learner.flat_weights(), atol=1e-4, rtol=1e-3)


@pytest.mark.cuda
@cuda
def test_a_reload_mid_run_is_copied_in_without_recapture_and_a_new_shape_is_captured():
    learner = Learner(CARTPOLE, HP(), device="cuda")
    data = batches(CARTPOLE, learner, 3)
    learner.update(data[0])
    learner.set_hparams(lr=0.0, ent_coef=0.5)
    frozen = learner.flat_weights()
    learner.update(data[1])
    np.testing.assert_array_equal(learner.flat_weights(), frozen)
    learner.set_hparams(lr=1e-3)
    learner.update(data[2])
    assert not np.array_equal(learner.flat_weights(), frozen)
    assert learner.stepper.captures == 1
    learner.update(make_batch(CARTPOLE, learner, n=256))  # another batch shape: captured anew
    assert learner.stepper.captures == 2
