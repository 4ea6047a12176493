"""Serving a torch network on CUDA from captured graphs, one per batch-size bucket.

A small policy network's forward pass on a GPU costs little more than its kernel launches;
a CUDA graph replays all of them with one launch. A graph has fixed shapes, so a batch of N
rows runs the graph of its bucket, the smallest power of two >= N (``row_capacity``, as the
learner's captured step sizes its buffers): its rows are copied into the first N rows of the
bucket's static input buffers, the graph replayed, and the first N rows of its static outputs
read. The padding rows past N hold earlier rows (at capture: copies of the batch's first row,
so every row the network sees is a valid observation) and their outputs are never read:
the networks served are row-wise, so a padding row changes no other row's output. The serving
loop answers at most ``inference.max_batch`` rows per pass, so the largest bucket is the power
of two at or above it (a few graphs: 1, 2, 4, ... rows).

Capture is lazy, at the first batch of a bucket, following torch.cuda.graphs' rules: warm-up
calls on a side stream, then the capture on the static buffers. A capture that fails (an
operation a graph cannot hold) is logged once, ``inference_graph_capture_failed`` with the
reason, and every batch from then on runs eagerly. The graphs read the module's parameters
where they are, so weights copied into them in place are served at the next replay.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog
import torch

from rlinkd.daemon.learner.graphed import row_capacity

log = structlog.get_logger("inference")
Inputs = dict[str, torch.Tensor]
NetFn = Callable[[Inputs], tuple[torch.Tensor, ...]]
"""Inputs (each [N, ...] on the device, N rows alike) -> outputs (each [N, ...]), row-wise."""
WARMUP_CALLS = 3


@dataclass
class Bucket:
    """One bucket's graph and the static buffers it reads and writes (``rows`` rows each)."""

    graph: Any
    inputs: Inputs
    outputs: tuple[torch.Tensor, ...]


class GraphedNet:
    """``fn`` served from one captured graph per bucket (see the module docstring)."""

    def __init__(self, fn: NetFn, device: torch.device, what: str) -> None:
        self.fn, self.device, self.what = fn, device, what
        self.buckets: dict[int, Bucket] = {}
        self.failed = ""  # the reason the capture failed (then every call runs ``fn``)

    @property
    def captures(self) -> int:
        return len(self.buckets)

    def __call__(self, inputs: Inputs) -> tuple[torch.Tensor, ...]:
        """``fn(inputs)``, from the graph of the batch's bucket; the outputs are views of
        its static buffers, valid until the next call."""
        rows = int(next(iter(inputs.values())).shape[0])
        bucket = self.buckets.get(row_capacity(rows)) if rows and not self.failed else None
        if bucket is None and rows and not self.failed:
            bucket = self._capture(inputs, row_capacity(rows))
        if bucket is None:
            return self.fn(inputs)
        for key, value in inputs.items():
            bucket.inputs[key][:rows].copy_(value)
        bucket.graph.replay()
        return tuple(out[:rows] for out in bucket.outputs)

    def _capture(self, inputs: Inputs, rows: int) -> Bucket | None:
        """The bucket of ``rows`` rows, its buffers filled with the batch's first row; None
        (logged, and eager from then on) when the capture fails. The batch runs eagerly
        first: an input the network itself refuses raises to the caller, as without graphs,
        and does not turn the graphs off."""
        self.fn(inputs)
        static = {k: v[:1].expand(rows, *v.shape[1:]).clone() for k, v in inputs.items()}
        try:
            graph, outputs = self._record(static)
        except RuntimeError as exc:  # an operation the graph cannot hold: eager from now on
            self.failed = _reason(exc)
            log.warning("inference_graph_capture_failed", what=self.what, rows=rows,
                        reason=self.failed, fallback="eager")
            return None
        self.buckets[rows] = bucket = Bucket(graph, static, outputs)
        log.info("inference_graph_captured", what=self.what, rows=rows, captures=self.captures)
        return bucket

    def _record(self, static: Inputs) -> tuple[Any, tuple[torch.Tensor, ...]]:
        """Warm-up calls on a side stream, then the capture of one call on ``static``."""
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.device(self.device):  # (a capture stream of this device, not cuda:0's)
            with torch.cuda.stream(side):
                for _ in range(WARMUP_CALLS):
                    self.fn(static)
            torch.cuda.current_stream(self.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=side):
                outputs = tuple(self.fn(static))
        return graph, outputs


def _reason(exc: BaseException) -> str:
    """The first line of why a capture failed: the error raised inside the capture where
    ending the capture raised another (an invalidated capture) on top of it."""
    cause = exc.__context__ if isinstance(exc.__context__, Exception) else exc
    text = str(cause).strip()
    return text.splitlines()[0] if text else type(cause).__name__


def served(fn: NetFn, device: torch.device, what: str) -> NetFn:
    """``fn`` as the torch backend serves it on ``device``: from captured graphs on CUDA,
    as it is elsewhere."""
    return GraphedNet(fn, device, what) if device.type == "cuda" else fn
