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
step instead of hundreds. Capture follows torch.cuda.graphs' rules: warm-up steps on a side
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


def _layout(data: dict[str, Any]) -> tuple:
    """What a captured graph depends on: every tensor's name, shape and dtype."""
    return tuple((k, _layout(v)) if isinstance(v, dict) else (k, tuple(v.shape), v.dtype)
                 for k, v in sorted(data.items()))


def _copy_into(static: dict[str, Any], data: dict[str, Any]) -> None:
    for key, value in data.items():
        if isinstance(value, dict):
            _copy_into(static[key], value)
        else:
            static[key].copy_(value, non_blocking=True)


def _empty_like(data: dict[str, Any]) -> dict[str, Any]:
    return {k: _empty_like(v) if isinstance(v, dict) else torch.empty_like(v) for k, v in data.items()}


class GraphedStepper:
    """The step captured as a CUDA graph per data layout (see the module docstring)."""

    def __init__(self, step: StepFn, state: list[torch.Tensor], what: str = "") -> None:
        self.step, self.state, self.what = step, state, what
        self.eager = EagerStepper(step)
        self.key: tuple | None = None
        self.failed = ""           # why capture failed ("" while it has not)
        self.captures = 0          # graphs captured so far (tests, logs)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.static: dict[str, Any] = {}
        self.static_idx = torch.empty(0)
        self.static_out = torch.empty(0)

    def bind(self, data: dict[str, Any], rows: int) -> Run:
        if self.failed:
            return self.eager.bind(data, rows)
        key = (_layout(data), rows)
        if key != self.key:
            try:
                self._capture(data, rows)
            except RuntimeError as exc:  # an operation the graph cannot hold: eager from now on
                self.failed = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                self.graph, self.key = None, None
                log.warning("step_graph_capture_failed", what=self.what, reason=self.failed,
                            fallback="eager")
                return self.eager.bind(data, rows)
            self.key = key
        _copy_into(self.static, data)
        return self._replay

    def _replay(self, idx: torch.Tensor) -> torch.Tensor:
        assert self.graph is not None
        self.static_idx.copy_(idx, non_blocking=True)
        self.graph.replay()
        return self.static_out.clone()  # (the next replay overwrites static_out)

    def _capture(self, data: dict[str, Any], rows: int) -> None:
        """Static buffers for this layout, warm-up on a side stream, capture; the state a
        step changes is put back afterwards."""
        device = self.state[0].device
        self.static = _empty_like(data)
        _copy_into(self.static, data)
        self.static_idx = torch.zeros(rows, dtype=torch.long, device=device)
        saved = [t.clone() for t in self.state]
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        try:
            with torch.cuda.stream(side):
                for _ in range(WARMUP_STEPS):
                    self.step(self.static, self.static_idx)
            torch.cuda.current_stream(device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self.static_out = self.step(self.static, self.static_idx)
        finally:
            torch.cuda.synchronize(device)
            for tensor, value in zip(self.state, saved):
                tensor.copy_(value)
        self.graph = graph
        self.captures += 1
        log.info("step_graph_captured", what=self.what, rows=rows, captures=self.captures)


def make_stepper(device: torch.device, step: StepFn, state: list[torch.Tensor], graphs: bool = True,
                 what: str = "") -> EagerStepper | GraphedStepper:
    """A graphed stepper on CUDA (unless ``graphs`` is False), the eager one elsewhere."""
    if graphs and device.type == "cuda":
        return GraphedStepper(step, state, what)
    return EagerStepper(step)
