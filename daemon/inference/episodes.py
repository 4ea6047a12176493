"""Server-side episodes: what the inference role remembers per lane, and the step records
it turns answered requests into (pure; no shared memory, no sockets).

A training lane's last answered request is its *pending step* (observation, action,
log-prob, dist inputs, version). The next STEP or END brings that step's reward: the
step is complete and becomes one step record, exactly what a client-side shared-memory
client would have written (``shm.records``). END adds the FINAL_OBS record with the done
flags. A cut (``cut``) closes every open fragment with a FINAL_OBS record of its pending
observation and no done flag: the next fragment of that episode starts with the pending
step, as a continued client-side fragment does. Evaluation lanes (EVALUATE on START)
produce no records: only their return and length, reported when they end.

A recurrent policy's lanes also keep a state (``LaneBook.state``): zeros at START, the
network's state out after each answered step. The pending step remembers the state fed
before it; when it completes at fragment position 0, L, 2L, ... (L = max_seq_len; the
position counts from the last cut) its record carries that state flagged HAS_STATE, on other
positions a zero state unflagged: the fragment state grid of ``protocol.recurrent``, also
for fragments that ``cut`` opens mid-episode. The state lives only in this process: a role
restart loses it with the lanes' episodes (their next STEP is answered STATUS_LOST).

Records carry the lane's *stream slot* (``SlotPool``), the agent slot of the inference
role's ring of that policy, held while the episode is open.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rlinkd.shm.lanes import (EVALUATE, OP_END, OP_RELEASE, OP_START, OP_STEP, STATUS_BAD_OBS,
                              STATUS_BAD_OP, STATUS_LOST, STATUS_OK, TERMINATED, TRUNCATED)
from rlinkd.shm.records import FINAL_OBS, HAS_DIST, HAS_LOGP, HAS_STATE, StepLayout
from rlinkd.shm.records import TERMINATED as REC_TERMINATED, TRUNCATED as REC_TRUNCATED

STEP_FLAGS = np.uint8(HAS_LOGP | HAS_DIST)


class SlotPool:
    """Agent slots of one policy's ring, lowest free first (the collector keeps per-slot
    state sized by the highest slot used)."""

    def __init__(self) -> None:
        self.free: list[int] = []
        self.next = 0

    def take(self) -> int:
        if self.free:
            return self.free.pop()
        self.next += 1
        return self.next - 1

    def give(self, slot: int) -> None:
        self.free.append(slot)
        if len(self.free) > 64:
            self.free.sort(reverse=True)


@dataclass
class Requests:
    """One area's pending requests, copied out of shared memory (the client may write the
    lanes again as soon as they are answered)."""

    lanes: np.ndarray    # [n] lane index
    seqs: np.ndarray     # [n] u32 req_seq as read
    ops: np.ndarray      # [n] u8
    flags: np.ndarray    # [n] u8
    rewards: np.ndarray  # [n] f32
    obs: np.ndarray      # [n] the lanes' obs structured rows (a copy)

    @classmethod
    def read(cls, lanes_view: np.ndarray, idx: np.ndarray) -> Requests:
        if len(idx) == 1:  # (a slice copy: a lone request's common case, half the cost)
            i = int(idx[0])
            rows = lanes_view[i:i + 1].copy()
        else:
            rows = lanes_view[idx]  # one fancy-index copy of the whole lanes
        return cls(idx, rows["req_seq"], rows["op"], rows["flags"], rows["reward"], rows["obs"])

    def __len__(self) -> int:
        return len(self.lanes)


@dataclass
class EvalEnd:
    episode_return: float
    episode_length: int
    weights_seq_no: int


@dataclass
class Outcome:
    """What one batch of requests did: per request a status and whether it needs an action;
    the step records to send; finished evaluation episodes; steps that train."""

    status: np.ndarray      # [n] i32
    wants_action: np.ndarray  # [n] bool
    explore: np.ndarray     # [n] bool (False: evaluation lanes act greedily)
    records: np.ndarray     # step records, in order
    eval_ends: list[EvalEnd]
    train_steps: int


class LaneBook:
    """The episode state of every lane of one area (one policy). Owned by the inference
    process; ``apply`` is called once per batch with that area's pending requests, then
    ``remember`` with the actions chosen."""

    def __init__(self, capacity: int, layout: StepLayout, slots: SlotPool, max_seq_len: int = 0) -> None:
        self.layout, self.slots = layout, slots
        self.max_seq_len = max_seq_len if layout.state_size else 0  # L (0: feed-forward)
        self.state = np.zeros((capacity, layout.state_size), np.float32)  # before the next step
        self.open = np.zeros(capacity, bool)
        self.evaluate = np.zeros(capacity, bool)
        self.slot = np.full(capacity, -1, np.int64)
        self.pending = layout.empty(capacity)  # the last answered request as a step record
        self.has_pending = np.zeros(capacity, bool)
        self.fragment_steps = np.zeros(capacity, np.int64)  # steps since the fragment began
        self.ret = np.zeros(capacity, np.float64)
        self.length = np.zeros(capacity, np.int64)

    def grow(self, capacity: int) -> None:
        """Room for lanes ``[0, capacity)`` (new lanes closed); called when areas are added."""
        old = len(self.open)
        if capacity <= old:
            return
        extra = capacity - old

        def more(a: np.ndarray, fill) -> np.ndarray:
            return np.concatenate([a, np.full(extra, fill, a.dtype)])
        self.open, self.evaluate = more(self.open, False), more(self.evaluate, False)
        self.slot, self.has_pending = more(self.slot, -1), more(self.has_pending, False)
        self.fragment_steps, self.ret, self.length = (more(self.fragment_steps, 0), more(self.ret, 0.0),
                                                      more(self.length, 0))
        pending = self.layout.empty(capacity)
        pending[:old] = self.pending
        self.pending = pending
        state = np.zeros((capacity, self.layout.state_size), np.float32)
        state[:old] = self.state
        self.state = state

    def open_training_lanes(self) -> int:
        return int(np.count_nonzero(self.open & ~self.evaluate))

    # ------------------------------------------------------------ one batch
    def apply(self, req: Requests, bad_obs: np.ndarray) -> Outcome:
        """Validate ops against lane state, complete pending steps, end and start episodes.
        ``bad_obs`` [n] marks requests whose observation failed the space check."""
        ops, lanes = req.ops, req.lanes
        known = np.isin(ops, (OP_START, OP_STEP, OP_END, OP_RELEASE))
        status = np.where(known, STATUS_OK, STATUS_BAD_OP).astype(np.int32)
        needs_open = (ops == OP_STEP) | (ops == OP_END)
        status[known & needs_open & ~self.open[lanes]] = STATUS_LOST
        status[(status == STATUS_OK) & bad_obs & (ops != OP_RELEASE)] = STATUS_BAD_OBS
        ok = status == STATUS_OK
        explore = ~self.evaluate[lanes]  # as the lanes stood before this batch's STARTs
        parts = [self._complete(req, ok & needs_open)]
        train_steps = len(parts[0])
        evals = self._end(req, ok & (ops == OP_END), parts)
        self._abandon(lanes[ok & ((ops == OP_START) | (ops == OP_RELEASE)) & self.open[lanes]], parts)
        self._start(req, ok & (ops == OP_START))
        wants = ok & ((ops == OP_START) | (ops == OP_STEP))
        explore[ops == OP_START] = ~self.evaluate[lanes[ops == OP_START]]
        records = concat(parts, self.layout)
        return Outcome(status, wants, explore, records, evals, train_steps)

    def apply_one(self, lane: int, op: int, flags: int, reward: float, obs: np.ndarray,
                  bad_obs: bool, out: list[np.ndarray]) -> tuple[int, bool, bool, EvalEnd | None, int]:
        """``apply`` for one request, in scalar code (the common case of a lone client: a
        tenth of the vectorised path's cost). Appends step records to ``out``; returns
        (status, wants_action, explore, finished evaluation episode or None, train steps).
        A second implementation of ``apply`` kept in production for lone requests (those
        step.c does not serve) because ``apply`` on one row costs a lone request's Python
        turn ~2.8x as much (bench/scenarios/book_one.py: 167 against 463 us median on a
        loaded 2-core box, 5 interleaved runs). Oracles: ``apply`` is this method's
        (tests/unit/test_inference_server.py: scalar and vectorised bookkeeping agree), and
        this method (+ the draw + ``remember_one``) is native/step.c's
        (tests/unit/test_lonestep.py: native and Python lone steps agree)."""
        is_open = bool(self.open[lane])
        if op not in (OP_START, OP_STEP, OP_END, OP_RELEASE):
            return STATUS_BAD_OP, False, True, None, 0
        if op in (OP_STEP, OP_END) and not is_open:
            return STATUS_LOST, False, True, None, 0
        if bad_obs and op != OP_RELEASE:
            return STATUS_BAD_OBS, False, True, None, 0
        evaluate, steps, ended = bool(self.evaluate[lane]), 0, None
        if op in (OP_STEP, OP_END):
            self.ret[lane] += reward
            self.length[lane] += 1
            if not evaluate and self.has_pending[lane]:
                rec = self.pending[lane:lane + 1].copy()
                rec["reward"] = reward
                if self.max_seq_len:
                    self._grid(rec, self.fragment_steps[lane:lane + 1])
                out.append(rec)
                self.fragment_steps[lane] += 1
                steps = 1
            self.has_pending[lane] = False
        if op == OP_END:
            if evaluate:
                ended = EvalEnd(float(self.ret[lane]), int(self.length[lane]),
                                int(self.pending["weights_seq_no"][lane]))
            else:
                final = self.layout.empty(1)
                final["obs"][0] = obs
                final["flags"] = (FINAL_OBS | (REC_TERMINATED if flags & TERMINATED else 0)
                                  | (REC_TRUNCATED if flags & TRUNCATED else 0))
                final["stream_id"] = self.slot[lane]
                final["weights_seq_no"] = -1
                out.append(final)
            self._close(np.array([lane]))
        elif op in (OP_START, OP_RELEASE) and is_open:
            self._abandon(np.array([lane]), out)
        if op == OP_START:
            self._start_one(lane, bool(flags & EVALUATE))
            evaluate = bool(flags & EVALUATE)
        return STATUS_OK, op in (OP_START, OP_STEP), not evaluate, ended, steps

    def _start_one(self, lane: int, evaluate: bool) -> None:
        self.open[lane], self.evaluate[lane] = True, evaluate
        self.state[lane] = 0.0
        self.ret[lane], self.length[lane], self.fragment_steps[lane] = 0.0, 0, 0
        if not evaluate:
            self.slot[lane] = self.slots.take()

    def remember_one(self, lane: int, obs: np.ndarray, action: np.ndarray, logp: float,
                     dist: np.ndarray, seq: int, state_out: np.ndarray | None = None) -> None:
        p = self.pending[lane]
        if state_out is not None:  # (a recurrent policy: the state before and after the step)
            p["state"] = self.state[lane]
            self.state[lane] = state_out
        p["obs"] = obs
        p["action"] = action
        p["logp"] = logp
        if len(dist):
            p["dist"] = dist
        p["weights_seq_no"] = seq
        p["flags"] = STEP_FLAGS
        p["stream_id"] = self.slot[lane]
        self.has_pending[lane] = True

    def _complete(self, req: Requests, rows: np.ndarray) -> np.ndarray:
        """Pending steps completed by their reward: training lanes give records, evaluation
        lanes add to their return."""
        lanes = req.lanes[rows]
        rewards = req.rewards[rows]
        self.ret[lanes] += rewards
        self.length[lanes] += 1
        train = ~self.evaluate[lanes] & self.has_pending[lanes]
        rec = self.pending[lanes[train]].copy()
        rec["reward"] = rewards[train]
        if self.max_seq_len:
            self._grid(rec, self.fragment_steps[lanes[train]])
        self.fragment_steps[lanes[train]] += 1
        self.has_pending[lanes] = False
        return rec

    def _grid(self, rec: np.ndarray, positions: np.ndarray) -> None:
        """Completed steps at fragment ``positions``: on the state grid (0, L, 2L, ...) they
        keep their state, flagged HAS_STATE; elsewhere the state field is zeroed."""
        on_grid = positions % self.max_seq_len == 0
        rec["flags"][on_grid] |= HAS_STATE
        rec["state"][~on_grid] = 0.0

    def _end(self, req: Requests, rows: np.ndarray, parts: list[np.ndarray]) -> list[EvalEnd]:
        lanes = req.lanes[rows]
        evals = [EvalEnd(float(self.ret[i]), int(self.length[i]), int(self.pending["weights_seq_no"][i]))
                 for i in lanes[self.evaluate[lanes]]]
        train = ~self.evaluate[lanes]
        final = self.layout.empty(int(np.count_nonzero(train)))
        final["obs"] = req.obs[rows][train]
        done = req.flags[rows][train]
        final["flags"] = (FINAL_OBS | np.where(done & TERMINATED, REC_TERMINATED, 0)
                          | np.where(done & TRUNCATED, REC_TRUNCATED, 0)).astype(np.uint8)
        final["stream_id"] = self.slot[lanes[train]]
        final["weights_seq_no"] = -1
        parts.append(final)
        self._close(lanes)
        return evals

    def _abandon(self, lanes: np.ndarray, parts: list[np.ndarray]) -> None:
        """A lane restarted or released mid-episode: its fragment ends truncated at the
        pending observation (every step before it is complete)."""
        train = lanes[~self.evaluate[lanes] & (self.fragment_steps[lanes] > 0)]
        final = self.layout.empty(len(train))
        final["obs"] = self.pending["obs"][train]
        final["flags"] = FINAL_OBS | REC_TRUNCATED
        final["stream_id"] = self.slot[train]
        parts.append(final)
        self._close(lanes)

    def _close(self, lanes: np.ndarray) -> None:
        for slot in self.slot[lanes]:
            if slot >= 0:
                self.slots.give(int(slot))
        self.open[lanes] = False
        self.has_pending[lanes] = False
        self.slot[lanes] = -1
        self.fragment_steps[lanes] = 0

    def _start(self, req: Requests, rows: np.ndarray) -> None:
        lanes = req.lanes[rows]
        self.open[lanes] = True
        self.evaluate[lanes] = (req.flags[rows] & EVALUATE) != 0
        self.ret[lanes] = 0.0
        self.length[lanes] = 0
        self.fragment_steps[lanes] = 0
        self.state[lanes] = 0.0
        for i in lanes[~self.evaluate[lanes]]:
            self.slot[i] = self.slots.take()

    def remember(self, req: Requests, rows: np.ndarray, actions: np.ndarray, logp: np.ndarray,
                 dist: np.ndarray, seq: int, state_out: np.ndarray | None = None) -> None:
        """The actions chosen for requests ``rows``: they are the lanes' pending steps (a
        recurrent policy: ``state_out`` [n, S] is the lanes' state after them)."""
        lanes = req.lanes[rows]
        p = self.pending
        if state_out is not None:
            p["state"][lanes] = self.state[lanes]
            self.state[lanes] = state_out
        p["obs"][lanes] = req.obs[rows]
        p["action"][lanes] = actions
        p["logp"][lanes] = logp
        if p["dist"].shape[1]:
            p["dist"][lanes] = dist
        p["weights_seq_no"][lanes] = seq
        p["flags"][lanes] = STEP_FLAGS
        p["stream_id"][lanes] = self.slot[lanes]
        self.has_pending[lanes] = True

    # ------------------------------------------------------------ sample boundaries
    def new_fragments(self) -> None:
        """The policy's link to the collector was (re)connected: the collector numbers every
        stream's fragment from 0 on a new link and the records of the old one are gone, so
        each open lane's next record begins a fragment (recurrent: on the state grid, with
        the state it had before that step). In place: the native step binds the array."""
        self.fragment_steps[:] = 0

    def cut(self) -> np.ndarray:
        """Close every training fragment that has steps: a FINAL_OBS record of its pending
        observation, no done flag (the episode continues in the next fragment)."""
        lanes = np.flatnonzero(self.open & ~self.evaluate & (self.fragment_steps > 0) & self.has_pending)
        final = self.layout.empty(len(lanes))
        final["obs"] = self.pending["obs"][lanes]
        final["flags"] = FINAL_OBS
        final["stream_id"] = self.slot[lanes]
        self.fragment_steps[lanes] = 0
        return final

    def drop(self, lanes: slice) -> np.ndarray:
        """An area's client went away: end every open training fragment of its ``lanes``
        (truncated) and close them."""
        parts: list[np.ndarray] = []
        self._abandon(np.flatnonzero(self.open[lanes]) + (lanes.start or 0), parts)
        return parts[0]


def concat(parts: list[np.ndarray], layout: StepLayout) -> np.ndarray:
    """Record arrays joined keeping the exact record dtype (np.concatenate would drop padding)."""
    parts = [p for p in parts if len(p)]
    if not parts:
        return layout.empty(0)
    if len(parts) == 1:
        return parts[0]
    out = layout.empty(sum(len(p) for p in parts))
    start = 0
    for p in parts:
        out[start:start + len(p)] = p
        start += len(p)
    return out
