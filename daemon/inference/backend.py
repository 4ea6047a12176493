"""The inference role's forward pass: one weights version, many backends, the fastest chosen.

Every backend runs the same network (``PolicySpec``, one description of its maths) from the
same flat weights and returns dist inputs [N, D] float32; ``tests/unit/test_inference_backend``
checks they agree. ``choose_backend`` times each available backend on batches of 1 and 64 at
boot and keeps the fastest: numpy for small MLPs, onnxruntime for convolutions, torch on CUDA
when a GPU is present (``inference.backend`` forces one).

``PolicyRunner`` owns one policy's board: ``refresh`` loads a newer version between batches
(never during one: a batch never mixes weight versions), ``act`` samples (or takes the mode)
with the client library's own distributions, so a served action is distributed exactly as a
client-side one.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import numpy as np
import structlog

from rlinkd.client_lib.policy import ActionChooser, has_conv, onnx_input_key, session
from rlinkd.client_lib.protocol.netnumpy import NumpyNet
from rlinkd.client_lib.protocol.netonnx import OnnxWeightWriter
from rlinkd.client_lib.protocol.netops import DIST
from rlinkd.client_lib.protocol.policy_spec import ONNX_OUTPUT_NAME, PolicySpec
from rlinkd.client_lib.protocol.records import obs_columns
from rlinkd.client_lib.protocol.spaces import Space
from rlinkd.shm.board import WeightsBoard

log = structlog.get_logger("inference")
BACKENDS = ("auto", "numpy", "onnxruntime", "torch")
Forward = Callable[[Mapping[str, np.ndarray]], np.ndarray]


def numpy_forward(spec: PolicySpec, flat: np.ndarray) -> Forward:
    net = NumpyNet(spec, flat, (DIST,))
    return lambda obs: net.run(obs)[DIST]


def onnx_forward(spec: PolicySpec, flat: np.ndarray) -> Forward:
    sess = session(OnnxWeightWriter(spec).encode(flat), threads=1)
    names = {i.name: onnx_input_key(i.name) for i in sess.get_inputs()}
    return lambda obs: sess.run([ONNX_OUTPUT_NAME], {n: np.ascontiguousarray(obs[k])
                                                     for n, k in names.items()})[0]


def torch_forward(spec: PolicySpec, flat: np.ndarray) -> Forward:
    """The learner's own module on CUDA when there is one, else on the CPU (imports torch)."""
    import torch

    from rlinkd.daemon.learner.model import ActorCritic
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = ActorCritic(spec).to(device)
    model.load_flat(flat)
    model.eval()

    def run(obs: Mapping[str, np.ndarray]) -> np.ndarray:
        with torch.inference_mode():
            x = {k: torch.as_tensor(np.ascontiguousarray(v), device=device) for k, v in obs.items()}
            return model.dist_inputs(x).float().cpu().numpy()
    return run


MAKERS: dict[str, Callable[[PolicySpec, np.ndarray], Forward]] = {
    "numpy": numpy_forward, "onnxruntime": onnx_forward, "torch": torch_forward}


def cuda_present() -> bool:
    """A GPU without importing torch (importing it costs seconds and hundreds of MB)."""
    import os
    return os.path.exists("/dev/nvidiactl")


def candidates(spec: PolicySpec) -> list[str]:
    """Backends worth timing for this network on this machine."""
    if cuda_present():
        return ["torch"]
    return ["onnxruntime", "numpy"] if has_conv(spec) else ["numpy", "onnxruntime"]


def time_backend(forward: Forward, sample_obs: Callable[[int], Mapping[str, np.ndarray]],
                 repeats: int = 20) -> float:
    """Median seconds of one call on batch 1 plus one on batch 64 (the two regimes served)."""
    costs = []
    for rows in (1, 64):
        obs = sample_obs(rows)
        forward(obs)  # warm up
        runs = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            forward(obs)
            runs.append(time.perf_counter() - t0)
        costs.append(float(np.median(runs)))
    return sum(costs)


def choose_backend(spec: PolicySpec, flat: np.ndarray, wanted: str,
                   sample_obs: Callable[[int], Mapping[str, np.ndarray]]) -> tuple[str, dict[str, float]]:
    """(backend name, seconds measured per candidate). ``wanted`` other than "auto" is taken
    as is (no timing)."""
    if wanted != "auto":
        return wanted, {}
    timings = {}
    for name in candidates(spec):
        timings[name] = time_backend(MAKERS[name](spec, flat), sample_obs)
    if len(timings) == 1:
        return next(iter(timings)), timings
    return min(timings, key=timings.__getitem__), timings


class PolicyRunner:
    """One policy's weights (from its board) and action choice. Used only by the inference
    loop: ``refresh`` before a batch, ``act`` on it."""

    def __init__(self, name: str, spec: PolicySpec, obs_space: Space, act_space: Space,
                 board: WeightsBoard, backend: str, seed: int | None = None) -> None:
        self.name, self.spec, self.obs_space, self.board = name, spec, obs_space, board
        self.wanted = backend
        self.backend = ""
        self.chooser = ActionChooser(act_space, seed)
        self.weights_seq_no = -1
        self.flat = np.empty(spec.n_params(), np.float32)
        self.forward: Forward | None = None
        self.timings: dict[str, float] = {}

    @property
    def ready(self) -> bool:
        return self.forward is not None

    def refresh(self) -> bool:
        """Load the board's newest version if it changed (between batches). True if loaded."""
        latest = self.board.latest_seq_no()
        if latest < 0 or latest == self.weights_seq_no:
            return False
        seq, _ = self.board.read(self.flat)
        if not self.backend:
            self.backend, self.timings = choose_backend(self.spec, self.flat, self.wanted, self._sample_obs)
            log.info("inference_backend", policy=self.name, backend=self.backend,
                     timings_us={k: round(v * 1e6, 1) for k, v in self.timings.items()})
        self.forward = MAKERS[self.backend](self.spec, self.flat)
        self.weights_seq_no = seq
        return True

    def _sample_obs(self, rows: int) -> Mapping[str, np.ndarray]:
        from rlinkd.shm.records import StepLayout
        from rlinkd.client_lib.protocol.spaces import record_fields
        rec = StepLayout(record_fields(self.obs_space), 1, 0).empty(rows)
        return obs_columns(rec["obs"], self.obs_space)

    def act(self, obs_rows: np.ndarray, explore: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(actions [N, A] f32, logp [N] f32, dist inputs [N, D] f32) for obs rows (the lane
        records' structured obs), sampling where ``explore`` and taking the mode elsewhere."""
        assert self.forward is not None, "refresh() first"
        dist = np.asarray(self.forward(obs_columns(obs_rows, self.obs_space)), np.float32)
        if explore.all():
            actions, logp = self.chooser.choose_batch(dist, True)
        elif not explore.any():
            actions, logp = self.chooser.choose_batch(dist, False)
        else:
            actions = np.empty((len(dist), self.chooser.dist.action_size), np.float32)
            logp = np.empty(len(dist), np.float32)
            for mask, flag in ((explore, True), (~explore, False)):
                actions[mask], logp[mask] = self.chooser.choose_batch(dist[mask], flag)
        return actions, np.asarray(logp, np.float32), dist
