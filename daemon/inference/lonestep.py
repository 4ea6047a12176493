"""Lone requests served in native code (``_native.LoneStep``, native/step.c).

A lone client (one shared-memory agent, one TCP or direct connection) sends one request per
turn, and the inference role's Python per request (~40 us: copy, obs check, ``LaneBook``,
forward, draw, answer) was most of its round trip. ``LoneStepper.serve`` hands a turn's lone
requests to native code, which serves the common cases -- the START of an episode on a
closed lane, a STEP or the END of an open one; the observation a flat float32 Box strictly
inside its bounds, a Discrete action, the native backend for batch 1, no epsilon -- doing
exactly what ``LaneBook.apply_one`` + the draw + ``remember_one`` do (a property test
compares the two paths), and declines anything else, changing nothing, for the Python path.

``InferenceServer`` makes one per policy when its first area arrives (``maybe``: None when
the spaces or the extension do not allow it, or ``step`` is left out of
``inference.native_parts``) and calls ``serve`` in each turn with lone requests. The test
oracle is the Python path (``LaneBook.apply_one``, tests/unit/test_lonestep.py).
"""
from __future__ import annotations

import numpy as np

from rlinkd.client_lib.protocol.spaces import Discrete
from rlinkd.daemon.inference.backend import PolicyRunner
from rlinkd.daemon.inference.episodes import STEP_FLAGS, LaneBook
from rlinkd.daemon.inference.netnative import native_module
from rlinkd.shm.lanes import EVALUATE, OP_END, OP_START, OP_STEP, TERMINATED, TRUNCATED, LaneLayout
from rlinkd.shm.records import FINAL_OBS
from rlinkd.shm.records import TERMINATED as REC_TERMINATED, TRUNCATED as REC_TRUNCATED

MAX_RECORDS = 64  # step records one ``serve`` call writes at most (then it returns)
EVAL_END, START, END = 1, 2, 3  # serve's events: an evaluation episode ended, a training one
                                # started (it needs a slot), a training one ended (its slot back)

LANE_FIELDS = ("req_seq", "resp_seq", "op", "flags", "reward", "status", "weights_seq_no", "logp", "action", "obs")
RECORD_FIELDS = ("flags", "stream_id", "weights_seq_no", "reward", "logp", "obs", "action", "dist")
CONSTANTS = ("obs_floats", "dist", "op_step", "op_start", "op_end", "evaluate", "terminated", "truncated",
             "step_flags", "final_obs", "rec_terminated", "rec_truncated")
LONE_LAYOUT = (("L_", (*LANE_FIELDS, "bytes")), ("R_", (*RECORD_FIELDS, "bytes")), ("K_", CONSTANTS))
"""The layout tuple ``LoneStep`` takes: lane offsets and size, record offsets and size, sizes and
constants, in this order (step.c's L_, R_ and K_ enums, generated from this: rlinkd.daemon.c_headers)."""


def _offsets(dtype: np.dtype, names: tuple[str, ...]) -> list[int]:
    fields = dtype.fields
    assert fields is not None
    return [fields[name][1] for name in names]


class LoneStepper:
    """One policy's native lone step (see the module docstring)."""

    def __init__(self, lane_layout: LaneLayout, low: np.ndarray, high: np.ndarray) -> None:
        step = lane_layout.step
        constants = dict(obs_floats=len(low), dist=step.dist_size, op_step=OP_STEP, op_start=OP_START,
                         op_end=OP_END, evaluate=EVALUATE, terminated=TERMINATED, truncated=TRUNCATED,
                         step_flags=int(STEP_FLAGS), final_obs=FINAL_OBS, rec_terminated=REC_TERMINATED,
                         rec_truncated=REC_TRUNCATED)
        layout = (*_offsets(lane_layout.dtype, LANE_FIELDS), lane_layout.lane_bytes,
                  *_offsets(step.dtype, RECORD_FIELDS), step.record_bytes, *(constants[k] for k in CONSTANTS))
        self.native = native_module().LoneStep(layout, np.ascontiguousarray(low, np.float32),
                                               np.ascontiguousarray(high, np.float32))
        self.records = step.empty(MAX_RECORDS)  # (serve's completed step records)
        self.bound: np.ndarray | None = None

    @classmethod
    def maybe(cls, runner: PolicyRunner, lane_layout: LaneLayout) -> LoneStepper | None:
        """A stepper when the policy's spaces are the common case and the extension is built;
        None for a recurrent policy (the native lone step keeps no state; the role feeds each
        lane's state to the policy's Step, which may be the native interpreter's)."""
        step, bounds = lane_layout.step, runner.float_bounds
        if (native_module() is None or not step.is_flat or bounds is None or len(bounds) != 1
                or step.state_size  # (a recurrent policy: its lanes' states are kept in Python)
                or not isinstance(runner.act_space, Discrete) or step.action_size != 1
                or step.dist_size != runner.act_space.n):
            return None
        _, low, high = bounds[0]
        if low.size * 4 != step.dtype["obs"].itemsize:
            return None
        return cls(lane_layout, low.ravel(), high.ravel())

    @staticmethod
    def ready(runner: PolicyRunner) -> bool:
        """The runner's weights run natively at batch 1 and it draws no epsilon: ``serve``
        may take requests (else every one would be declined)."""
        return runner.native_small is not None and runner.epsilon is None

    def serve(self, lanes: np.ndarray, order: np.ndarray, start: int, book: LaneBook, runner: PolicyRunner,
              max_steps: int) -> tuple[int, int, int, bool, tuple | None]:
        """Serve the lanes ``order[start:]`` (int64) in order, in one native call, until
        one is declined, ``max_steps`` train steps were completed (the caller's sample
        boundary), MAX_RECORDS records were nearly written, or an episode started or ended.
        Returns (next, records, steps, declined, event): ``order[start:next]`` were served,
        ``self.records[:records]`` are the records they wrote (``steps`` of them train
        steps); if ``declined``, ``order[next]`` was declined, nothing changed (serve it in
        Python, then call again from ``next + 1``); ``event`` (of ``order[next - 1]``):
        None, (EVAL_END, return, length, version), (START, ...): a training episode
        started, its lane needs a slot (``take_slot``), or (END, slot, ...): a training
        episode ended, its slot goes back to the pool. The runner's weights are current;
        called by the role's serving turn. An exception (``random()`` failing) leaves the
        lanes before it answered and their records unsent: the role then ends, and
        restarts, like any exception in its loop."""
        if not self._bind(book, runner):
            return start, 0, 0, True, None
        return self.native.serve(runner.native_small.program, lanes, order, start,  # type: ignore[union-attr]
                                 runner.rng.random, runner.weights_seq_no, self.records, max(1, max_steps))

    @staticmethod
    def take_slot(book: LaneBook, lane: int) -> None:
        """A training episode the native code started: its agent slot, as ``_start_one``
        takes it, also in its pending step (what ``remember_one`` would have written)."""
        slot = book.slot[lane] = book.slots.take()
        book.pending["stream_id"][lane] = slot

    def _bind(self, book: LaneBook, runner: PolicyRunner) -> bool:
        """The book's current arrays bound; False when the runner cannot run natively now
        (see ``ready``: every request would be declined)."""
        if runner.native_small is None or runner.epsilon is not None:
            return False
        if book.open is not self.bound:  # (LaneBook.grow replaces its arrays)
            self.native.bind(book.open, book.evaluate, book.slot, book.pending, book.has_pending,
                             book.fragment_steps, book.ret, book.length)
            self.bound = book.open
        return True
