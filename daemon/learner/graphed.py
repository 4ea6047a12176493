"""The learner's SGD step run eagerly, or on CUDA captured once as a CUDA graph and replayed.

A step function ``step(data, idx) -> diagnostics`` (``Learner._sgd_step``) reads the update's
tensors ``data`` (a dict of tensors, nested one level for observations) at the minibatch rows
``idx`` [b] and returns a diagnostics tensor; it must read nothing back to the host. Both
steppers have one method, ``bind(data, rows) -> run(idx)``, called once per update (the
replay learners, ``DQNLearner`` and ``SACLearner``, bind each sample with ``rows`` 0 and
run it once: their step trains on the whole sample). ``run`` returns a fresh tensor.

``GraphedStepper`` (CUDA): ``data`` is copied into static buffers (allocated at the first
update and again whenever a shape or dtype changes, when the step is captured anew), each
minibatch's indices into a static index buffer, and the graph replayed: one launch per SGD
step instead of hundreds. A step that reads its rows through ``idx`` (``rows`` > 0: PPO's
minibatches) gets buffers of a row capacity, a power of two that only grows, the batch in
their first N rows: train batches come in varying sizes (whatever the connector had, 256,
768, 512, 1,024 rows in turn), and a capture per size would cost more than the replays save;
``idx`` never reaches past N. A step that reads all its data (``rows`` 0) gets exact shapes.
Capture follows torch.cuda.graphs' rules: warm-up steps on a side
stream first; the tensors a step changes (``state``: weights, gradients, moments, step count)
are saved before the warm-up and restored after the capture, so capturing trains nothing.
Values that change between updates must live in device tensors the step reads (the
optimizer's lr_t, the learner's ent_coef_t): python numbers are baked into the graph. When
capture fails (an operation that cannot be captured, such as a host-to-device copy of a
python constant) the failure is logged with its reason and the eager step runs from then on.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import structlog
import torch

log = structlog.get_logger("learner")
StepFn = Callable[[dict[str, Any], torch.Tensor], torch.Tensor]
Run = Callable[[torch.Tensor], torch.Tensor]
WARMUP_STEPS = 3


class EagerStepper:
    """The step as written (the CPU, and the fallback)."""

    def __init__(self, step: StepFn) -> None:
        self.step = step

    def bind(self, data: dict[str, Any], rows: int) -> Run:
        return lambda idx: self.step(data, idx)


def _layout(data: dict[str, Any], capacity: int) -> tuple:
    """What a captured graph depends on: every tensor's name, dtype and shape, the leading
    (row) dimension as ``capacity``."""
    return tuple((k, _layout(v, capacity)) if isinstance(v, dict) else
                 (k, (capacity, *v.shape[1:]), v.dtype) for k, v in sorted(data.items()))


def _rows_of(data: dict[str, Any]) -> int:
    """N, the leading dimension (every tensor of an update's data has N rows)."""
    first = next(iter(data.values()))
    return _rows_of(first) if isinstance(first, dict) else int(first.shape[0])


def _copy_into(static: dict[str, Any], data: dict[str, Any]) -> None:
    """``data``'s N rows into the first N rows of the static buffers."""
    for key, value in data.items():
        if isinstance(value, dict):
            _copy_into(static[key], value)
        else:
            static[key][:value.shape[0]].copy_(value, non_blocking=True)


def _empty_like(data: dict[str, Any], capacity: int) -> dict[str, Any]:
    return {k: _empty_like(v, capacity) if isinstance(v, dict) else
            v.new_empty((capacity, *v.shape[1:])) for k, v in data.items()}


def row_capacity(n: int, current: int = 0) -> int:
    """The static buffers' rows for a batch of ``n``: a power of two >= n, never below the
    ``current`` capacity (so a smaller batch after a larger one replays the same graph)."""
    return max(current, 1 << max(n - 1, 0).bit_length())


class GraphedStepper:
    """The step captured as a CUDA graph per data layout (see the module docstring)."""

    def __init__(self, step: StepFn, state: list[torch.Tensor], what: str = "") -> None:
        self.step, self.state, self.what = step, state, what
        self.eager = EagerStepper(step)
        self.key: tuple | None = None
        self.capacity = 0          # the static buffers' rows (see the module docstring)
        self.failed = ""           # why capture failed ("" while it has not)
        self.captures = 0          # graphs captured so far (tests, logs)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.static: dict[str, Any] = {}
        self.static_idx = torch.empty(0)
        self.static_out = torch.empty(0)

    def bind(self, data: dict[str, Any], rows: int) -> Run:
        if self.failed:
            return self.eager.bind(data, rows)
        key = self._key(data, rows)
        if key != self.key:
            try:
                self._capture(data, rows, key[2])
            except RuntimeError as exc:  # an operation the graph cannot hold: eager from now on
                self.failed = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                self.graph, self.key = None, None
                log.warning("step_graph_capture_failed", what=self.what, reason=self.failed,
                            fallback="eager")
                return self.eager.bind(data, rows)
            self.key, self.capacity = key, key[2]
        _copy_into(self.static, data)
        return self._replay

    def _key(self, data: dict[str, Any], rows: int) -> tuple:
        """(layout, rows, capacity) of the graph ``data`` needs: the current capacity while the
        batch fits it and the layout is the same, a larger or a fresh one otherwise."""
        n = _rows_of(data)
        if not rows:
            return _layout(data, n), rows, n
        same = self.key is not None and self.key[1:] == (rows, self.capacity) and \
            self.key[0] == _layout(data, self.capacity)
        capacity = row_capacity(n, self.capacity if same else 0)
        return _layout(data, capacity), rows, capacity

    def _replay(self, idx: torch.Tensor) -> torch.Tensor:
        assert self.graph is not None
        self.static_idx.copy_(idx, non_blocking=True)
        self.graph.replay()
        return self.static_out.clone()  # (the next replay overwrites static_out)

    def _capture(self, data: dict[str, Any], rows: int, capacity: int) -> None:
        """Static buffers for this layout (``capacity`` rows), then the graph recorded."""
        self.static = _empty_like(data, capacity)
        _copy_into(self.static, data)
        self.static_idx = torch.zeros(rows, dtype=torch.long, device=self.state[0].device)
        self._record(rows)

    def _record(self, rows: int) -> None:
        """Warm-up on a side stream, capture on the static buffers; the state a step changes
        is put back afterwards."""
        device = self.state[0].device
        saved = [t.clone() for t in self.state]
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        try:
            with torch.cuda.device(device):  # (a capture stream of this device, not cuda:0's)
                with torch.cuda.stream(side):
                    for _ in range(WARMUP_STEPS):
                        self.step(self.static, self.static_idx)
                torch.cuda.current_stream(device).wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, stream=side):
                    self.static_out = self.step(self.static, self.static_idx)
        finally:
            torch.cuda.synchronize(device)
            for tensor, value in zip(self.state, saved):
                tensor.copy_(value)
        self.graph = graph
        self.captures += 1
        log.info("step_graph_captured", what=self.what, rows=rows, capacity=_rows_of(self.static),
                 captures=self.captures)


def make_stepper(device: torch.device, step: StepFn, state: list[torch.Tensor], graphs: bool = True,
                 what: str = "") -> EagerStepper | GraphedStepper:
    """A graphed stepper on CUDA (unless ``graphs`` is False), the eager one elsewhere."""
    if graphs and device.type == "cuda":
        return GraphedStepper(step, state, what)
    return EagerStepper(step)
