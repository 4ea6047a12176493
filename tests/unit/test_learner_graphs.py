"""The learner's captured SGD step (``daemon.learner.graphed``), for PPO, DQN and SAC.

Without CUDA: the CPU runs the eager step, a capture that fails falls back to it (logged
with the reason), and a step copies no constant to the device (counted: such a copy cannot be
captured). With CUDA (marker ``cuda``, ``make gpu-check``): graphed and eager updates give the
same weights within ATOL/RTOL, an MLP and a network with convolutions among them, DQN and SAC
with a composite observation (a one-hot leaf); a checkpoint round trip; a reload mid-run
copies lr and ent_coef into the graph's tensors without recapture
(compared with a learner built with that ent_coef); a new batch shape is captured anew.
"""
from __future__ import annotations

import numpy as np
import pytest
import structlog
import torch

from rlinkd.client_lib.protocol.policy_spec import PolicySpec
from rlinkd.client_lib.protocol.spaces import Box, Dict, Discrete, record_fields
from rlinkd.daemon.config import DQNConfig, SACConfig
from rlinkd.daemon.learner import graphed
from rlinkd.daemon.learner.dqn_learner import DQNLearner
from rlinkd.daemon.learner.learner import Learner
from rlinkd.daemon.learner.sac_learner import SACLearner
from rlinkd.shm.records import StepLayout
from rlinkd.shm.replay import ReplayLayout
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


COMPOSITE = Dict((("kind", Discrete(4, start=1)), ("pos", Box((3,), low=-1.0, high=1.0))))
SAC_SPEC = PolicySpec(COMPOSITE, Box((2,), low=-2.0, high=[2.0, 1.0]), hidden_sizes=(32, 32),
                      activation="relu", box_dist="squashed_gaussian")
DQN_SPEC = PolicySpec(COMPOSITE, Discrete(3), hidden_sizes=(32,), activation="relu")


def replay_rows(spec: PolicySpec, n: int = 64, seed: int = 0) -> np.ndarray:
    """Replay rows of `spec` (the COMPOSITE observation) with random values."""
    rng = np.random.default_rng(seed)
    out = ReplayLayout(StepLayout(record_fields(spec.obs_space), spec.action_size, 0)).empty(n)
    for key in ("obs", "next_obs"):
        out[key]["kind"] = rng.integers(1, 5, n)
        out[key]["pos"] = rng.uniform(-1, 1, (n, 3))
    out["action"] = (rng.integers(0, 3, (n, 1)) if spec is DQN_SPEC
                     else rng.uniform(-1, 1, (n, spec.action_size)))
    out["reward"], out["discount"] = rng.normal(size=n), np.where(rng.random(n) < 0.2, 0.0, 0.9)
    return out


def replay_learner(spec: PolicySpec, device: str, graphs: bool = True) -> DQNLearner | SACLearner:
    if spec is DQN_SPEC:
        return DQNLearner(spec, DQNConfig(lr=1e-3, target_update_interval_updates=2), device=device,
                          seed=3, graphs=graphs)
    return SACLearner(spec, SACConfig(lr=1e-3, max_grad_norm=1.0), device=device, seed=3, graphs=graphs)


@pytest.mark.parametrize("make", [lambda: Learner(CARTPOLE, HP(), device="cpu"),
                                  lambda: replay_learner(DQN_SPEC, "cpu"),
                                  lambda: replay_learner(SAC_SPEC, "cpu")], ids=["ppo", "dqn", "sac"])
def test_the_cpu_steps_eagerly(make):
    assert isinstance(make().stepper, graphed.EagerStepper)


def _to_a_device(args, kwargs) -> bool:
    """Whether a ``Tensor.to`` call names a device (a copy there), not only a dtype."""
    return any(isinstance(a, (str, torch.device)) for a in args) or "device" in kwargs


@pytest.mark.parametrize("spec", [DQN_SPEC, SAC_SPEC], ids=["dqn", "sac"])
def test_a_step_copies_no_constant_to_the_device(monkeypatch, spec):
    """A python constant made a tensor, or a CPU tensor moved to the device, inside the step
    is a host-to-device copy that a CUDA graph cannot hold (counted on the CPU)."""
    learner, batch = replay_learner(spec, "cpu"), replay_rows(spec)
    learner.train_step(batch)
    data, copies = learner._to_tensors(batch), []
    for name in ("tensor", "as_tensor", "from_numpy"):
        monkeypatch.setattr(torch, name, _counted(getattr(torch, name), copies, name))
    real_to = torch.Tensor.to
    monkeypatch.setattr(torch.Tensor, "to", lambda self, *a, **k: (
        copies.append("to") if _to_a_device(a, k) else None) or real_to(self, *a, **k))
    stats = learner._sgd_step(data, torch.zeros(0, dtype=torch.long))
    assert copies == [] and stats.shape == (len(learner.train_step(batch)),)


def _counted(real, calls: list, name: str):
    def counted(*args, **kwargs):
        calls.append(name)
        return real(*args, **kwargs)
    return counted


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


class ReplayedOnTheCpu:
    """A stand-in for a captured graph: replay runs the step on the static buffers."""

    def __init__(self, stepper: graphed.GraphedStepper) -> None:
        self.stepper = stepper

    def replay(self) -> None:
        s = self.stepper
        s.static_out = s.step(s.static, s.static_idx)


def test_batches_of_varying_sizes_replay_one_graph_of_a_growing_capacity(monkeypatch):
    """Train batches come in whatever size the connector had: a capture per size would
    cost more than it saves. The buffers hold a power-of-two row capacity that only grows;
    the batch sits in their first N rows, which are all a minibatch index reaches."""
    def step(data, idx):                                   # reads its rows through idx only
        return data["x"][idx] * 10 + data["obs"]["o"][idx].sum(dim=1)
    stepper = graphed.GraphedStepper(step, [torch.zeros(3)], "ppo")
    recorded = []

    def record(rows: int) -> None:
        recorded.append(graphed._rows_of(stepper.static))
        stepper.graph = ReplayedOnTheCpu(stepper)           # type: ignore[assignment]
        stepper.captures += 1
    monkeypatch.setattr(stepper, "_record", record)
    rng = np.random.default_rng(0)
    for n in (256, 768, 512, 1024, 256, 1000):
        data = {"x": torch.from_numpy(rng.normal(size=n)), "obs": {"o": torch.from_numpy(rng.normal(size=(n, 3)))}}
        idx = torch.from_numpy(rng.integers(0, n, 64))
        np.testing.assert_allclose(stepper.bind(data, 64)(idx), step(data, idx))
    assert recorded == [256, 1024]                         # (not one capture per batch size)
    whole = graphed.GraphedStepper(lambda data, idx: data["x"].sum(), [torch.zeros(1)], "dqn")
    monkeypatch.setattr(whole, "_record", lambda rows: setattr(whole, "graph", ReplayedOnTheCpu(whole)))
    for n in (32, 32, 48):                                 # a step that reads everything: exact shapes
        data = {"x": torch.ones(n)}
        assert float(whole.bind(data, 0)(torch.zeros(0, dtype=torch.long))) == n
    assert graphed.row_capacity(1) == 1 and graphed.row_capacity(257) == 512
    assert graphed.row_capacity(100, 512) == 512


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
    """lr and ent_coef reloaded after the capture: the graph reads both (as a learner built
    with that ent_coef, resumed from the same state), and a new batch shape is captured anew."""
    learner = Learner(CARTPOLE, HP(lr=0.0, ent_coef=0.0), device="cuda")
    data, frozen = batches(CARTPOLE, learner, 3), learner.flat_weights()
    learner.update(data[0])                               # captured; lr 0: weights unchanged
    np.testing.assert_array_equal(learner.flat_weights(), frozen)
    state = learner.state_dict()
    learner.set_hparams(lr=1e-3, ent_coef=0.5)
    for batch in data[1:]:
        learner.update(batch)
    assert not np.array_equal(learner.flat_weights(), frozen)
    np.testing.assert_allclose(learner.flat_weights(), built_with(0.5, state, data[1:]), atol=ATOL, rtol=RTOL)
    assert not np.allclose(learner.flat_weights(), built_with(0.0, state, data[1:]), atol=ATOL, rtol=RTOL)
    assert learner.stepper.captures == 1
    learner.update(make_batch(CARTPOLE, learner, n=256))  # another batch shape: captured anew
    assert learner.stepper.captures == 2


def built_with(ent_coef: float, state: dict, data: list[dict]) -> np.ndarray:
    """The weights after `data` of a graphed learner built with lr 1e-3 and `ent_coef`,
    resumed from `state`."""
    learner = Learner(CARTPOLE, HP(lr=1e-3, ent_coef=ent_coef), device="cuda")
    learner.load_state_dict(state)
    for batch in data:
        learner.update(batch)
    return learner.flat_weights()


def replay_weights(learner: DQNLearner | SACLearner) -> list[np.ndarray]:
    """Every network a replay learner trains or follows."""
    if isinstance(learner, DQNLearner):
        return [learner.flat_weights(), learner.target.flat_weights()]
    return [learner.flat_weights(), learner.log_alpha.detach().cpu().numpy()[None]] + \
        [c.flat_weights() for c in learner.critics + learner.targets]


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("spec", [DQN_SPEC, SAC_SPEC], ids=["dqn", "sac"])
def test_graphed_and_eager_replay_steps_agree(spec):
    """Five steps (DQN: the target network copied twice), a reload of lr mid-run without
    recapture, and a smaller sample captured anew."""
    graph, eager = replay_learner(spec, "cuda"), replay_learner(spec, "cuda", graphs=False)
    for i in range(6):
        if i == 3:
            for learner in (graph, eager):
                learner.set_hparams(lr=3e-4)
        g, e = graph.train_step(replay_rows(spec, seed=i)), eager.train_step(replay_rows(spec, seed=i))
        for mine, theirs in zip(replay_weights(graph), replay_weights(eager)):
            np.testing.assert_allclose(mine, theirs, atol=ATOL, rtol=RTOL)
        assert dict(g) == pytest.approx(dict(e), abs=1e-5, rel=1e-4)
    assert graph.stepper.captures == 1 and not graph.stepper.failed
    graph.train_step(replay_rows(spec, n=32))
    assert graph.stepper.captures == 2 and not graph.stepper.failed


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("spec", [DQN_SPEC, SAC_SPEC], ids=["dqn", "sac"])
def test_a_graphed_replay_checkpoint_resumes_on_the_gpu_and_the_cpu(spec):
    learner = replay_learner(spec, "cuda")
    for i in range(3):
        learner.train_step(replay_rows(spec, seed=i))
    state = learner.state_dict()
    for device in ("cuda", "cpu"):
        resumed = replay_learner(spec, device)
        resumed.load_state_dict(state)
        for mine, theirs in zip(replay_weights(resumed), replay_weights(learner)):
            np.testing.assert_array_equal(mine, theirs)


class _Stand:
    """A stand-in for a CUDA stream or graph (the capture then runs its steps on the CPU)."""

    def wait_stream(self, other) -> None:
        pass


def test_a_capture_failing_inside_the_sac_step_leaves_an_eager_learner_as_if_untried(monkeypatch):
    """The failure comes from inside the step being captured (after the warm-up, halfway
    through the actor's part): the learner logs it, puts back what the warm-up changed, and
    its eager step then trains exactly as a learner that never tried."""
    from contextlib import nullcontext

    from rlinkd.daemon.learner import sac_learner
    for name, stand in (("Stream", lambda device: _Stand()), ("current_stream", lambda device: _Stand()),
                        ("stream", lambda s: nullcontext()), ("graph", lambda g, stream: nullcontext()),
                        ("device", lambda device: nullcontext()),
                        ("CUDAGraph", _Stand), ("synchronize", lambda device: None)):
        monkeypatch.setattr(graphed.torch.cuda, name, stand)
    calls, real = [], sac_learner.actor_loss_terms

    def uncapturable(*args):
        calls.append(1)
        if len(calls) == graphed.WARMUP_STEPS + 1:
            raise RuntimeError("operation not permitted when stream is capturing")
        return real(*args)
    monkeypatch.setattr(sac_learner, "actor_loss_terms", uncapturable)
    tried, untried = replay_learner(SAC_SPEC, "cpu"), replay_learner(SAC_SPEC, "cpu")
    tried.stepper = graphed.GraphedStepper(tried._sgd_step, tried._step_state(), "sac")
    with structlog.testing.capture_logs() as logs:
        for i in range(2):
            assert dict(tried.train_step(replay_rows(SAC_SPEC, seed=i))) == \
                dict(untried.train_step(replay_rows(SAC_SPEC, seed=i)))
    assert [e["what"] for e in logs if e["event"] == "step_graph_capture_failed"] == ["sac"]
    for mine, theirs in zip(replay_weights(tried), replay_weights(untried)):
        np.testing.assert_array_equal(mine, theirs)
