"""The torch backend served from captured CUDA graphs per batch-size bucket
(``daemon.inference.cuda_graphs``, ``torch_backend``).

Without CUDA, with stand-ins for the graph: the buckets (powers of two), the copy of a batch
into a bucket's static buffers and of its rows out (padding rows never read), a lazy capture
per bucket after warm-up calls, the timing of a candidate replaying the graph, a failed
capture logged once and then eager, and a newer weights version loaded in place. With CUDA
(marker ``cuda``, ``make gpu-check``): graphed and eager outputs agree, forward and
recurrent step, and a reload is served without a recapture.
"""
from __future__ import annotations

from contextlib import nullcontext

import numpy as np
import pytest
import structlog
import torch

from rlinkd.client_lib.protocol.policy_spec import PolicySpec
from rlinkd.client_lib.protocol.spaces import Box, Discrete
from rlinkd.daemon.inference import cuda_graphs
from rlinkd.daemon.inference.backend import MAKERS, STEP_MAKERS, time_backend
from rlinkd.daemon.inference.torch_backend import Reloadable, reloaded
from rlinkd.daemon.learner.graphed import row_capacity

SPEC = PolicySpec(Box((4,)), Discrete(3), hidden_sizes=(16,))
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (torch sees none)")


def rowwise(x: dict) -> tuple:
    """A row-wise network that refuses an invalid row (a one-hot leaf's 0 when it starts at 1)."""
    assert bool((x["kind"] >= 1).all()), "an invalid row reached the network"
    return (x["pos"] * 2 + x["kind"][:, None], x["pos"].sum(dim=1))


class Replayed:
    """A stand-in for a captured graph: replay runs ``fn`` on the static inputs, into the
    static outputs (as a graph writes them)."""

    def __init__(self, fn, static: dict, outputs: tuple) -> None:
        self.fn, self.static, self.outputs, self.replays = fn, static, outputs, 0

    def replay(self) -> None:
        self.replays += 1
        for out, new in zip(self.outputs, self.fn(self.static)):
            out.copy_(new)


def on_the_cpu(net: cuda_graphs.GraphedNet, monkeypatch) -> list[Replayed]:
    """``net`` capturing stand-in graphs (listed as they are made)."""
    graphs: list[Replayed] = []

    def record(static):
        outputs = tuple(net.fn(static))
        graphs.append(Replayed(net.fn, static, outputs))
        return graphs[-1], outputs
    monkeypatch.setattr(net, "_record", record)
    return graphs


def batch(rows: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {"pos": torch.from_numpy(rng.normal(size=(rows, 3)).astype(np.float32)),
            "kind": torch.from_numpy(rng.integers(1, 5, rows))}


def test_buckets_are_powers_of_two():
    assert [row_capacity(n) for n in (1, 2, 3, 4, 5, 63, 64, 65, 200, 256)] == \
        [1, 2, 4, 4, 8, 64, 64, 128, 256, 256]


def test_a_batch_runs_the_graph_of_its_bucket_through_the_static_buffers(monkeypatch):
    """Each bucket is captured once, at its first batch; a batch is copied into the first
    rows of the bucket's buffers and only its rows are read out, equal to the eager outputs.
    The padding rows hold valid rows (the first row at capture, earlier batches' after)."""
    net = cuda_graphs.GraphedNet(rowwise, torch.device("cpu"), "forward")
    graphs = on_the_cpu(net, monkeypatch)
    for i, rows in enumerate((3, 4, 1, 7, 3, 8, 2)):
        x = batch(rows, seed=i)
        got = net(x)
        assert [g.shape[0] for g in got] == [rows, rows]
        for mine, eager in zip(got, rowwise(x)):
            torch.testing.assert_close(mine, eager, rtol=0, atol=0)
        if rows == 7:                                      # captured here: the padding row is row 0
            for key, column in x.items():
                assert torch.equal(net.buckets[8].inputs[key][7], column[0])
    assert sorted(net.buckets) == [1, 2, 4, 8] and net.captures == 4 and not net.failed
    assert [g.replays for g in graphs] == [3, 1, 2, 1]    # buckets 4 (3, 4, 3 rows), 1, 8 (7, 8), 2
    assert graphs[0].static is net.buckets[4].inputs      # one set of static buffers per bucket


def test_the_capture_warms_up_on_a_side_stream_first(monkeypatch):
    """The real ``_record`` with stand-ins for torch.cuda: the batch run eagerly, then
    WARMUP_CALLS calls on the side stream, then one call captured, per bucket."""
    calls = []
    stand_ins(monkeypatch, lambda stream: calls.append("warm-up") or nullcontext(),
              lambda graph, stream: calls.append("capture") or nullcontext())
    net = cuda_graphs.GraphedNet(lambda x: calls.append("call") or rowwise(x), torch.device("cpu"), "forward")
    net(batch(3))
    net(batch(4))
    net(batch(5))
    per_bucket = ["call", "warm-up"] + ["call"] * cuda_graphs.WARMUP_CALLS + ["capture", "call"]
    assert calls == per_bucket * 2 and net.captures == 2


class Stand:
    """A stand-in for a CUDA stream or graph."""

    def wait_stream(self, other) -> None:
        pass

    def replay(self) -> None:
        pass


def stand_ins(monkeypatch, stream, graph) -> None:
    for name, stand in (("Stream", lambda device: Stand()), ("current_stream", lambda device: Stand()),
                        ("stream", stream), ("graph", graph), ("device", lambda device: nullcontext()),
                        ("CUDAGraph", Stand)):
        monkeypatch.setattr(cuda_graphs.torch.cuda, name, stand)


def test_a_failed_capture_is_logged_once_and_every_batch_then_runs_eagerly(monkeypatch):
    def no_capture(graph, stream):
        raise RuntimeError("operation not permitted when stream is capturing\nmore")
    stand_ins(monkeypatch, lambda stream: nullcontext(), no_capture)
    calls = []
    net = cuda_graphs.GraphedNet(lambda x: calls.append(1) or rowwise(x), torch.device("cpu"), "step")
    with structlog.testing.capture_logs() as logs:
        for rows in (3, 3, 16):
            x = batch(rows)
            for mine, eager in zip(net(x), rowwise(x)):
                torch.testing.assert_close(mine, eager, rtol=0, atol=0)
    failed = [e for e in logs if e["event"] == "inference_graph_capture_failed"]
    assert len(failed) == 1 and failed[0]["reason"] == "operation not permitted when stream is capturing"
    assert failed[0]["what"] == "step" and net.captures == 0
    assert len(calls) == 1 + cuda_graphs.WARMUP_CALLS + 3  # the first batch, warm-up, then eager only


def test_a_batch_the_network_refuses_raises_and_leaves_the_graphs_on(monkeypatch):
    """An input error at a bucket's first batch is the caller's (as without graphs): it
    raises, nothing is captured or turned off, and the next valid batch is captured."""
    net = cuda_graphs.GraphedNet(rowwise, torch.device("cpu"), "forward")
    on_the_cpu(net, monkeypatch)
    bad = batch(3)
    bad["kind"][1] = 0
    with pytest.raises(AssertionError, match="an invalid row"):
        net(bad)
    assert net.captures == 0 and not net.failed
    net(batch(3))
    assert net.captures == 1 and not net.failed


def test_the_reason_of_a_failed_capture_is_the_error_raised_inside_it():
    try:
        try:
            raise RuntimeError("an op the graph cannot hold\ndetails")
        except RuntimeError:
            raise RuntimeError("operation failed due to a previous error during capture")  # noqa: B904 - as ending a capture raises
    except RuntimeError as exc:
        assert cuda_graphs._reason(exc) == "an op the graph cannot hold"
    assert cuda_graphs._reason(RuntimeError("")) == "RuntimeError"


def test_the_timing_of_a_batch_size_times_the_graph_replays(monkeypatch):
    """``time_backend``'s warm-up call captures the bucket; every timed call replays it."""
    calls = []
    net = cuda_graphs.GraphedNet(lambda x: calls.append(1) or rowwise(x), torch.device("cpu"), "forward")
    graphs = on_the_cpu(net, monkeypatch)
    x = batch(64)
    seconds = time_backend(lambda obs: net(obs)[0].numpy(), x, repeats=5)
    assert seconds > 0 and net.captures == 1 and graphs[0].replays == 1 + 5
    assert len(calls) == 2 + graphs[0].replays  # the eager first run, the capture's, then replays


def test_only_cuda_is_served_from_graphs():
    assert cuda_graphs.served(rowwise, torch.device("cpu"), "forward") is rowwise
    assert isinstance(cuda_graphs.served(rowwise, torch.device("cuda"), "forward"), cuda_graphs.GraphedNet)


def weights(seed: int, spec: PolicySpec = SPEC) -> np.ndarray:
    return (np.random.default_rng(seed).normal(size=spec.n_params()) * 0.5).astype(np.float32)


def test_a_newer_version_is_loaded_into_the_torch_forward_in_place():
    """The torch backend's forward takes a newer version in place (its graphs read the
    parameters where they are); another backend's is made anew."""
    obs = {"": np.random.default_rng(1).normal(size=(5, 4)).astype(np.float32)}
    forward = MAKERS["torch"](SPEC, weights(0))
    assert isinstance(forward, Reloadable)
    model = forward.load.__self__  # (the torch model the forward serves)
    pointers = [p.data_ptr() for p in model.parameters()]
    again = reloaded(forward, MAKERS["torch"], SPEC, weights(1))
    assert again is forward
    assert [p.data_ptr() for p in model.parameters()] == pointers  # (what a graph reads)
    np.testing.assert_allclose(again(obs), MAKERS["numpy"](SPEC, weights(1))(obs), rtol=1e-5, atol=1e-5)
    numpy = MAKERS["numpy"](SPEC, weights(0))
    assert reloaded(numpy, MAKERS["numpy"], SPEC, weights(1)) is not numpy


def graphed_nets(monkeypatch) -> list:
    made: list = []
    real = cuda_graphs.served
    monkeypatch.setattr(cuda_graphs, "served", lambda *a: made.append(real(*a)) or made[-1])
    return made


@pytest.mark.cuda
@cuda
def test_graphed_and_eager_forwards_agree_and_a_reload_is_not_recaptured(monkeypatch):
    made = graphed_nets(monkeypatch)
    forward = MAKERS["torch"](SPEC, weights(0))
    net = made[0]
    assert isinstance(net, cuda_graphs.GraphedNet)
    for version in (0, 1):
        forward = reloaded(forward, MAKERS["torch"], SPEC, weights(version))
        numpy = MAKERS["numpy"](SPEC, weights(version))
        for rows in (1, 3, 64, 200, 3):
            obs = {"": np.random.default_rng(rows).normal(size=(rows, 4)).astype(np.float32)}
            np.testing.assert_allclose(forward(obs), numpy(obs), rtol=1e-4, atol=1e-5)
    assert sorted(net.buckets) == [1, 4, 64, 256] and not net.failed and len(made) == 1


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_graphed_and_eager_recurrent_steps_agree(monkeypatch, cell):
    spec = PolicySpec(Box((4,)), Discrete(3), hidden_sizes=(16,), recurrent=cell, recurrent_size=8)
    made = graphed_nets(monkeypatch)
    step, numpy = STEP_MAKERS["torch"](spec, weights(0, spec)), STEP_MAKERS["numpy"](spec, weights(0, spec))
    for rows in (1, 5, 33):
        rng = np.random.default_rng(rows)
        obs = {"": rng.normal(size=(rows, 4)).astype(np.float32)}
        state = rng.normal(size=(rows, spec.state_size)).astype(np.float32)
        for mine, theirs in zip(step(obs, state), numpy(obs, state)):
            np.testing.assert_allclose(mine, theirs, rtol=1e-4, atol=1e-5)
    assert sorted(made[0].buckets) == [1, 8, 64] and not made[0].failed
