"""The inference role's forward pass: one weights version, many backends, the fastest chosen.

Every backend runs the same network (``PolicySpec``, one description of its maths) from the
same flat weights and returns dist inputs [N, D] float32; ``tests/unit/test_inference_backend``
checks they agree. ``choose_backend`` times each available backend on batches of 1 and 64 at
boot and keeps the fastest per batch size: the native interpreter (``netnative``, a compiled
extension) for small MLP batches, numpy or onnxruntime for large ones and for convolutions,
torch on CUDA timed beside them when a GPU is present (``torch_backend``: replayed from a
captured graph per batch-size bucket; ``inference.backend`` forces one).

``PolicyRunner`` owns one policy's board: ``refresh`` loads a newer version between batches
(never during one: a batch never mixes weight versions), ``act`` samples (or takes the mode)
with the client library's own distributions, so a served action is distributed exactly as a
client-side one.

A recurrent policy (``PolicySpec.recurrent``) runs a ``Step`` instead, (obs, state) ->
(dist inputs, state out), chosen the same way: ``choose_backend`` times the candidates'
steps (``STEP_MAKERS``: the native interpreter's ``NativeStep``, numpy, onnxruntime; torch
beside them on a GPU) per batch size and keeps the fastest (``inference.backend`` forces
one). The caller (``LaneBook``) keeps each lane's state.
"""
from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping

import numpy as np
import structlog

from rlinkd.client_lib.policy import ActionChooser, has_conv, onnx_input_key, session
from rlinkd.client_lib.protocol.distributions import categorical_one
from rlinkd.client_lib.protocol.netnumpy import NumpyNet
from rlinkd.client_lib.protocol.netonnx import OnnxWeightWriter
from rlinkd.client_lib.protocol.netops import DIST, STATE_IN, STATE_OUT
from rlinkd.client_lib.protocol.policy_spec import ONNX_OUTPUT_NAME, PolicySpec
from rlinkd.client_lib.protocol.records import obs_columns
from rlinkd.client_lib.protocol.spaces import Box, Space, field_name
from rlinkd.daemon.inference import netnative
from rlinkd.daemon.inference.torch_backend import reloaded, torch_forward, torch_step
from rlinkd.shm.board import WeightsBoard

log = structlog.get_logger("inference")
BACKENDS = ("auto", "native", "numpy", "onnxruntime", "torch")
Forward = Callable[[Mapping[str, np.ndarray]], np.ndarray]
Step = Callable[[Mapping[str, np.ndarray], np.ndarray], tuple[np.ndarray, np.ndarray]]
"""A recurrent network's forward: (obs columns, state [N, S]) -> (dist [N, D], state out [N, S])."""


def numpy_forward(spec: PolicySpec, flat: np.ndarray) -> Forward:
    net = NumpyNet(spec, flat, (DIST,))
    return lambda obs: net.run(obs)[DIST]


def onnx_forward(spec: PolicySpec, flat: np.ndarray) -> Forward:
    sess = session(OnnxWeightWriter(spec).encode(flat), threads=1)
    names = {i.name: onnx_input_key(i.name) for i in sess.get_inputs()}
    return lambda obs: sess.run([ONNX_OUTPUT_NAME], {n: np.ascontiguousarray(obs[k])
                                                     for n, k in names.items()})[0]


def numpy_step(spec: PolicySpec, flat: np.ndarray) -> Step:
    net = NumpyNet(spec, flat, (DIST, STATE_OUT))

    def run(obs: Mapping[str, np.ndarray], state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        out = net.run(obs, state)
        return out[DIST], out[STATE_OUT]
    return run


def onnx_step(spec: PolicySpec, flat: np.ndarray) -> Step:
    sess = session(OnnxWeightWriter(spec).encode(flat), threads=1)
    names = {i.name: onnx_input_key(i.name) for i in sess.get_inputs() if i.name != STATE_IN}

    def run(obs: Mapping[str, np.ndarray], state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        feed = {n: np.ascontiguousarray(obs[k]) for n, k in names.items()}
        dist, state_out = sess.run([ONNX_OUTPUT_NAME, STATE_OUT], {**feed, STATE_IN: state})
        return dist, state_out
    return run


def native_step(spec: PolicySpec, flat: np.ndarray) -> Step:
    """``netnative.Unsupported`` for a network with convolutions, or without the extension."""
    return netnative.NativeStep(spec, flat).run


STEP_MAKERS: dict[str, Callable[[PolicySpec, np.ndarray], Step]] = {
    "native": native_step, "numpy": numpy_step, "onnxruntime": onnx_step, "torch": torch_step}


def step_timed(make: Callable[[PolicySpec, np.ndarray], Step]) -> Callable[[PolicySpec, np.ndarray], Forward]:
    """A Step maker as a Forward maker for ``choose_backend`` to time: the step fed a
    nonzero state (0.1 everywhere: every gate's matmul and maths do work) of the batch's
    rows, made once per batch size (not inside the timed call)."""
    def make_forward(spec: PolicySpec, flat: np.ndarray) -> Forward:
        step = make(spec, flat)
        states: dict[int, np.ndarray] = {}

        def run(obs: Mapping[str, np.ndarray]) -> np.ndarray:
            rows = len(next(iter(obs.values())))
            state = states.get(rows)
            if state is None:
                state = states[rows] = np.full((rows, spec.state_size), 0.1, np.float32)
            return step(obs, state)[0]
        return run
    return make_forward


STEP_TIMED = {name: step_timed(make) for name, make in STEP_MAKERS.items()}
"""A recurrent policy's candidates, as ``choose_backend`` times them."""


def native_forward(spec: PolicySpec, flat: np.ndarray) -> Forward:
    """``netnative.Unsupported`` for a network with convolutions, or without the extension."""
    return netnative.NativeNet(spec, flat).run


MAKERS: dict[str, Callable[[PolicySpec, np.ndarray], Forward]] = {
    "native": native_forward, "numpy": numpy_forward, "onnxruntime": onnx_forward,
    "torch": torch_forward}


def cuda_present() -> bool:
    """A GPU without importing torch (importing it costs seconds and hundreds of MB)."""
    import os
    return os.path.exists("/dev/nvidiactl")


def candidates(spec: PolicySpec, gpu: bool | None = None, native: bool = True) -> list[str]:
    """Backends worth timing for this network on this machine: the CPU backends always (a
    small network's batch is answered faster on the CPU than a GPU round trip takes; the
    native interpreter only when ``native``, the ``net`` part, is on), torch on CUDA beside
    them when there is a GPU (``gpu``: default ``cuda_present()``)."""
    cpu = (["onnxruntime", "numpy"] if has_conv(spec) else
           (["native"] if native and netnative.available() else []) + ["numpy", "onnxruntime"])
    return cpu + (["torch"] if (cuda_present() if gpu is None else gpu) else [])


SMALL_BATCH = 16
"""Batches below this many rows run on the backend fastest at batch 1, others on the one
fastest at batch 64 (numpy wins small MLP batches, onnxruntime large ones)."""


_SCRATCH = np.ones(1 << 17)  # 1 MB read between timed calls (see time_backend)


def time_backend(forward: Forward, obs: Mapping[str, np.ndarray], repeats: int = 20) -> float:
    """Median seconds of one call, each after a pass over 1 MB of other data: in the role a
    forward pass runs between lane scans and bookkeeping, not back to back, and timed back to
    back onnxruntime's batch-1 call looked 2 us faster than numpy's while a whole serving turn
    was ~8 us slower with it (measured in-process: 50 against 41 us per lone request).
    The torch backend on CUDA captures the batch size's graph in the warm-up call, so the
    calls timed are the graph replays it serves with (``cuda_graphs``)."""
    forward(obs)  # warm up (and capture)
    runs = []
    for _ in range(repeats):
        _SCRATCH.sum()
        t0 = time.perf_counter()
        forward(obs)
        runs.append(time.perf_counter() - t0)
    return float(np.median(runs))


def choose_backend(spec: PolicySpec, flat: np.ndarray, wanted: str,
                   sample_obs: Callable[[int], Mapping[str, np.ndarray]], native: bool = True,
                   makers: Mapping[str, Callable[[PolicySpec, np.ndarray], Forward]] | None = None,
                   ) -> tuple[tuple[str, str], dict[str, float]]:
    """((backend for small batches, for large ones), seconds measured per candidate and batch
    size). ``wanted`` other than "auto" is taken for both, without timing; ``native``: the
    native interpreter is a candidate of "auto" (config.validate refuses "native" without it).
    ``makers``: what is timed, ``MAKERS`` (forwards: the default) or ``STEP_TIMED`` (a
    recurrent policy's steps)."""
    if wanted == "native" and (has_conv(spec) or not netnative.available()):
        log.warning("inference_backend_unavailable", wanted=wanted,
                    reason="convolutions" if netnative.available() else "the _native extension is not built")
        wanted = "auto"
    if wanted != "auto":
        return (wanted, wanted), {}
    timings, names, makers = {}, candidates(spec, native=native), MAKERS if makers is None else makers
    for name in names:
        forward = makers[name](spec, flat)
        for rows in (1, 64):
            timings[f"{name}@{rows}"] = time_backend(forward, sample_obs(rows))
    small = min(names, key=lambda n: timings[f"{n}@1"])
    large = min(names, key=lambda n: timings[f"{n}@64"])
    return (small, large), timings


def float_bounds(leaves: list) -> list[tuple[str, np.ndarray, np.ndarray]] | None:
    """(field, low, high) float32 per leaf when every leaf is a float Box, else None."""
    if not all(isinstance(space, Box) and space.is_float for _, _, space in leaves):
        return None
    return [(name, space.low_array.astype(np.float32), space.high_array.astype(np.float32))
            for _, name, space in leaves]


class PolicyRunner:
    """One policy's weights (from its board) and action choice. Used only by the inference
    loop: ``refresh`` before a batch, ``act`` on it."""

    def __init__(self, name: str, spec: PolicySpec, obs_space: Space, act_space: Space,
                 board: WeightsBoard, backend: str, seed: int | None = None, native: bool = True) -> None:
        self.name, self.spec, self.obs_space, self.board = name, spec, obs_space, board
        self.act_space = act_space
        self.wanted, self.native = backend, native  # (native: the ``net`` part may be chosen)
        self.backends: tuple[str, str] = ("", "")
        self.chooser = ActionChooser(act_space, seed, box_dist=spec.box_dist)
        self.rng = random.Random(seed)
        self.categorical = self.chooser._single_categorical
        self.epsilon: float | None = None  # a DQN policy's exploration (from WEIGHTS_READY)
        self.weights_seq_no = -1
        self.flat = np.empty(spec.n_params(), np.float32)
        self.forwards: tuple[Forward, Forward] | None = None
        self.steps: tuple[Step, Step] | None = None  # a recurrent policy's (``forwards`` stays None)
        self.native_small: netnative.NativeNet | None = None
        self.timings: dict[str, float] = {}
        self.batch1_s = 0.0  # one batch-1 forward pass of the small-batch backend (measured once)
        self.leaves = [(leaf.key, field_name(leaf.key), leaf.space) for leaf in obs_space.leaves()]
        self.float_bounds = float_bounds(self.leaves)
        self.small_bounds = ([(name, low.ravel().tolist(), high.ravel().tolist())
                              for name, low, high in self.float_bounds]
                             if self.float_bounds and all(low.size <= 16 for _, low, _ in self.float_bounds)
                             else None)  # (small flat leaves: one row is checked in plain Python)

    def _clearly_inside(self, obs_rows: np.ndarray) -> bool:
        """A quick yes for float Box leaves strictly inside their float32 bounds (the common
        case, ~2 us; ~1 us for one row of small leaves: NaN and +-inf fail the comparisons);
        anything else is left to the spaces' own checks."""
        if len(obs_rows) == 1 and self.small_bounds is not None:
            return all(lo < x < hi for name, low, high in self.small_bounds
                       for x, lo, hi in zip(obs_rows[name][0].ravel().tolist(), low, high))
        if self.float_bounds is None:
            return False
        for name, low, high in self.float_bounds:
            x = obs_rows[name]
            if not (np.isfinite(x).all() and (x > low).all() and (x < high).all()):
                return False
        return True

    def columns(self, obs_rows: np.ndarray) -> dict[str, np.ndarray]:
        """Leaf columns (views) of lane obs rows: ``records.obs_columns`` without its lookups."""
        return {key: obs_rows[name] for key, name, _ in self.leaves}

    def bad_rows(self, obs_rows: np.ndarray) -> np.ndarray:
        """[n] True where an observation does not fit the space (the spaces' own checks,
        vectorised; row by row only when the batch as a whole fails)."""
        bad = np.zeros(len(obs_rows), bool)
        if self._clearly_inside(obs_rows) or all(
                space.check(obs_rows[name], "obs") is None for _, name, space in self.leaves):
            return bad
        for i in range(len(obs_rows)):
            bad[i] = any(space.check(obs_rows[name][i:i + 1], "obs") is not None
                         for _, name, space in self.leaves)
        return bad

    @property
    def ready(self) -> bool:
        return self.forwards is not None or self.steps is not None

    @property
    def backend(self) -> str:
        small, large = self.backends
        return small if small == large else f"{small}/{large}"  # (batches <SMALL_BATCH rows / larger)

    def refresh(self) -> bool:
        """Load the board's newest version if it changed (between batches). True if loaded."""
        latest = self.board.latest_seq_no()
        if latest < 0 or latest == self.weights_seq_no:
            return False
        seq, _ = self.board.read(self.flat)
        if not self.backends[0]:
            self._choose_backends()
        if self.spec.state_size:
            self._load_steps()
        else:
            self._load_forwards()
        self.weights_seq_no = seq
        return True

    def _choose_backends(self) -> None:
        """The backends per batch size (timed once, at the first version), logged."""
        recurrent = {"recurrent": self.spec.recurrent} if self.spec.state_size else {}
        self.backends, self.timings = choose_backend(self.spec, self.flat, self.wanted, self._sample_obs,
                                                     self.native, STEP_TIMED if recurrent else MAKERS)
        log.info("inference_backend", policy=self.name, backend=self.backend,
                 timings_us={k: round(v * 1e6, 1) for k, v in self.timings.items()}, **recurrent)

    def _load_forwards(self) -> None:
        old = self.forwards or (None, None)
        small = reloaded(old[0], MAKERS[self.backends[0]], self.spec, self.flat)
        if not self.batch1_s:  # (timed by choose_backend, unless the backend was forced)
            self.batch1_s = self.timings.get(f"{self.backends[0]}@1") or time_backend(small, self._sample_obs(1))
        large = small if self.backends[1] == self.backends[0] else \
            reloaded(old[1], MAKERS[self.backends[1]], self.spec, self.flat)
        self.forwards = (small, large)
        # (the native net behind a batch-1 forward: a lone request's native step runs it)
        self.native_small = getattr(small, "__self__", None) if self.backends[0] == "native" else None

    def _load_steps(self) -> None:
        """A recurrent policy's steps (``native_small`` stays None: the native lone step
        keeps no state, lonestep.py)."""
        old = self.steps or (None, None)
        small = reloaded(old[0], STEP_MAKERS[self.backends[0]], self.spec, self.flat)
        if not self.batch1_s:  # (the serving turn's gather wait is scaled by it)
            zeros = np.zeros((1, self.spec.state_size), np.float32)
            self.batch1_s = (self.timings.get(f"{self.backends[0]}@1")
                             or time_backend(lambda obs: small(obs, zeros)[0], self._sample_obs(1)))
        large = small if self.backends[1] == self.backends[0] else \
            reloaded(old[1], STEP_MAKERS[self.backends[1]], self.spec, self.flat)
        self.steps = (small, large)

    def _sample_obs(self, rows: int) -> Mapping[str, np.ndarray]:
        from rlinkd.shm.records import StepLayout
        from rlinkd.client_lib.protocol.spaces import record_fields
        rec = StepLayout(record_fields(self.obs_space), 1, 0).empty(rows)
        return obs_columns(rec["obs"], self.obs_space)

    def act(self, obs_rows: np.ndarray, explore: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(actions [N, A] f32, logp [N] f32, dist inputs [N, D] f32) for obs rows (the lane
        records' structured obs), sampling where ``explore`` and taking the mode elsewhere."""
        assert self.forwards is not None, "refresh() first (a recurrent policy: act_with_state)"
        forward = self.forwards[0 if len(obs_rows) < SMALL_BATCH else 1]
        return self._choose(np.asarray(forward(self.columns(obs_rows)), np.float32), explore)

    def act_with_state(self, obs_rows: np.ndarray, explore: np.ndarray, state: np.ndarray
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``act`` for a recurrent policy: also the lanes' states before the step [N, S]
        in, and their states after it out (actions, logp, dist, state out)."""
        assert self.steps is not None, "refresh() first"
        step = self.steps[0 if len(obs_rows) < SMALL_BATCH else 1]
        dist, state_out = step(self.columns(obs_rows), np.ascontiguousarray(state, np.float32))
        return (*self._choose(np.asarray(dist, np.float32), explore), np.asarray(state_out, np.float32))

    def _choose(self, dist: np.ndarray, explore: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if len(dist) == 1 and self.categorical and self.epsilon is None:
            return self._one_categorical(dist, bool(explore[0]))
        if explore.all():
            actions, logp = self.chooser.choose_batch(dist, True, self.epsilon)
        elif not explore.any():
            actions, logp = self.chooser.choose_batch(dist, False)
        else:
            actions = np.empty((len(dist), self.chooser.dist.action_size), np.float32)
            logp = np.empty(len(dist), np.float32)
            for mask, flag in ((explore, True), (~explore, False)):
                actions[mask], logp[mask] = self.chooser.choose_batch(dist[mask], flag, self.epsilon)
        return actions, np.asarray(logp, np.float32), dist

    def _one_categorical(self, dist: np.ndarray, explore: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One Discrete choice in plain Python floats (``categorical_one``: a few
        microseconds; the numpy path costs ~8): the same distribution and log-probability."""
        a, logp = categorical_one(dist[0].tolist(), self.rng.random() if explore else None)
        return np.array([[a]], np.float32), np.array([logp], np.float32), dist
